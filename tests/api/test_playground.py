"""The web playground: the page at / with the ids the browser test relies on, its files, no external
URLs, off with KVLINK_RAG_PLAYGROUND=false, and kept out of the OpenAPI schema."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from api.routes.playground import PLAYGROUND_DIR

CONTRACT_IDS = {"api-key", "adapter", "doc-id", "doc-title", "doc-text", "doc-add", "doc-file", "doc-message",
                "doc-list", "question", "top-k", "compare", "ask", "answer", "answer-full", "ttft-compare",
                "used-docs", "used-method", "explain", "timings", "error"}
TIMINGS = {"retrieval_s", "cache_load_s", "link_s", "ttft_s", "total_s", "queue_wait_s"}


class Elements(HTMLParser):
    """Every start tag with its attributes, in document order."""

    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def parse(html: str) -> dict[str, tuple[str, dict]]:
    """``{id: (tag, attrs)}`` of the page, plus ``data-timing`` values under the key ``timing:<name>``."""
    p = Elements()
    p.feed(html)
    found = {a["id"]: (t, a) for t, a in p.tags if "id" in a}
    found.update({f"timing:{a['data-timing']}": (t, a) for t, a in p.tags if "data-timing" in a})
    return found


def test_the_page_has_every_element_of_the_dom_contract(client):
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"] == "text/html; charset=utf-8"
    found = parse(r.text)
    assert CONTRACT_IDS <= set(found)
    assert {f"timing:{t}" for t in TIMINGS} <= set(found)
    assert found["api-key"][1]["type"] == "password" and found["compare"][1]["type"] == "checkbox"
    assert found["explain"][1]["type"] == "checkbox" and "checked" in found["explain"][1]  # attribution by default
    assert found["doc-file"][1]["accept"] == ".txt,.md,.jsonl" and found["top-k"][1]["value"] == "3"
    assert found["doc-list"][0] == "ul" and found["used-docs"][0] == "ul" and found["question"][0] == "input"
    for answer in ("answer", "answer-full"):
        assert found[answer][1]["data-state"] == "idle" and found[answer][1]["data-chunks"] == "0"
    assert "hidden" in found["error"][1]
    labelled = {a["for"] for t, a in _tags(r.text) if t == "label"}
    inputs = {i for i, (t, a) in found.items() if t in ("input", "select", "textarea")}
    assert inputs <= labelled  # every control has a label


def _tags(html: str):
    p = Elements()
    p.feed(html)
    return p.tags


def test_scripts_and_style_sheet_are_served_with_their_types(client):
    js = "text/javascript"
    for name, kind in (("app.js", js), ("api.js", js), ("documents.js", js), ("style.css", "text/css")):
        r = client.get(f"/playground/{name}")
        assert r.status_code == 200 and r.headers["content-type"] == f"{kind}; charset=utf-8"
        assert r.text == (PLAYGROUND_DIR / name).read_text()
    for bad in ("nope.js", "%2e%2e", "%2e%2e%2fmain.py", "..%2Froutes%2Fplayground.py", "main.py"):
        r = client.get(f"/playground/{bad}")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", bad


def test_no_playground_file_refers_to_anything_outside_the_machine():
    files = sorted(PLAYGROUND_DIR.iterdir())
    assert {f.name for f in files} == {"index.html", "app.js", "api.js", "documents.js", "style.css"}
    for f in files:
        text = f.read_text()
        assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/|@import|url\(", text, re.I), f.name


def test_the_page_is_off_with_playground_false(make_client):
    with make_client(playground=False) as c:
        for path in ("/", "/playground/app.js"):
            r = c.get(path)
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        assert c.get("/healthz").status_code == 200


def test_openapi_is_the_same_with_or_without_the_page(make_client):
    with make_client(playground=False) as c:
        without = c.get("/openapi.json").json()
    with make_client() as c:
        with_page = c.get("/openapi.json").json()
        assert c.get("/").status_code == 200
    assert with_page == without
    assert not any(p == "/" or p.startswith("/playground") for p in with_page["paths"])
    mode = with_page["components"]["schemas"]["QueryIn"]["properties"]["mode"]
    assert mode["enum"] == ["linked", "full"] and mode["default"] == "linked"


def test_requests_for_page_files_share_one_metric_label(client):
    for name in ("app.js", "style.css", "missing.js"):
        client.get(f"/playground/{name}")
    metrics = client.get("/metrics").text
    routes = set(re.findall(r'kvlink_request_duration_seconds_count\{[^}]*route="([^"]*)"', metrics))
    assert "/playground/{name}" in routes and not any(r.endswith((".js", ".css")) for r in routes)
