"""The web playground in a real (headless, system) Chromium: ingest through the page, ask with the keyboard,
watch the answer stream in, delete a document; the narrow layout; API errors shown readably.

The page is driven only through the ids and attributes of its DOM contract (api/playground/index.html).
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request

import pytest

pytestmark = pytest.mark.browser

WAIT_S = 60
DOCS = {  # id -> (title, text): the fixture documents the tests ingest
    "lighthouse": ("Skerry Point lighthouse", "The lighthouse on Skerry Point was built in 1851 and painted red and "
                   "white. Its keeper, Agnes Moray, kept the lamp burning through the great storm of 1872."),
    "paris": ("Paris", "Paris is the capital and most populous city of France. The Seine river flows through the "
              "city, past the Louvre museum and Notre-Dame cathedral."),
}
VOLCANO = "Mount Erebus in Antarctica is the southernmost active volcano on Earth, with a persistent lava lake."
QUESTION = "Who kept the lamp of the Skerry Point lighthouse burning?"

# Records every change of #answer (its text length, data-state and data-chunks) into window.__answerLog.
ANSWER_LOG_JS = """
const el = document.getElementById('answer');
window.__answerLog = [];
new MutationObserver(() => window.__answerLog.push(
    {t: Date.now(), len: el.textContent.length, state: el.dataset.state, chunks: el.dataset.chunks}))
  .observe(el, {childList: true, characterData: true, subtree: true, attributes: true});
"""
DOC_STATUS_JS = """
return Object.fromEntries([...document.querySelectorAll('#doc-list li.doc')].map(
    li => [li.dataset.docId, (li.querySelector('.doc-status') || {}).textContent?.trim()]));
"""
USED_DOCS_JS = """
return [...document.querySelectorAll('#used-docs li.used')].map(
    li => [li.dataset.docId, (li.querySelector('.cache') || {}).textContent?.trim()]);
"""
SHARES_JS = "return [...document.querySelectorAll('#used-docs [data-share]')].map(e => Number(e.dataset.share));"
PASSAGES_JS = "return [...document.querySelectorAll('#used-docs li.passage')].map(e => e.textContent);"
NO_HORIZONTAL_SCROLL_JS = "return document.documentElement.scrollWidth <= window.innerWidth;"


def _wait(driver, condition, what: str, timeout: float = WAIT_S):
    """The first truthy ``condition(driver)`` within ``timeout`` seconds (polled every 0.1 s)."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(condition, message=f"waiting for {what}")


def _by_id(driver, element_id: str):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, element_id)


def _css(driver, selector: str):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, selector)


def _all_ready(doc_ids):
    """A wait condition: every one of ``doc_ids`` is listed in ``#doc-list`` with status ``ready``."""
    def ready(driver) -> bool:
        statuses = driver.execute_script(DOC_STATUS_JS)
        return all(statuses.get(doc_id) == "ready" for doc_id in doc_ids)

    return ready


def _type(driver, element_id: str, text: str) -> None:
    field = _by_id(driver, element_id)
    field.clear()
    field.send_keys(text)


def _add_with_form(driver, doc_id: str, title: str, text: str) -> None:
    _type(driver, "doc-id", doc_id)
    _type(driver, "doc-title", title)
    _type(driver, "doc-text", text)
    _by_id(driver, "doc-add").click()


def _open(driver, server) -> None:
    driver.get(server.url + "/")
    _wait(driver, lambda d: d.execute_script("return document.readyState") == "complete", "the page to load")


def _error_text(driver) -> str:
    """The text of ``#error`` when it is shown, else ''."""
    error = _by_id(driver, "error")
    return error.text.strip() if error.is_displayed() else ""


def _http_status(url: str, body: dict | None = None) -> int:
    """Status of a GET of ``url``, or of a POST of the JSON ``body``."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def _ask(driver, question: str) -> str:
    """Type ``question`` into ``#question``, press Enter, wait for the answer to end; its data-state."""
    from selenium.webdriver.common.keys import Keys

    _type(driver, "question", question)
    _by_id(driver, "question").send_keys(Keys.ENTER)
    return _wait(driver, lambda d: _by_id(d, "answer").get_attribute("data-state") in ("done", "error")
                 and _by_id(d, "answer").get_attribute("data-state"), "the answer")


def _assert_streamed_incrementally(log: list[dict], chunks: int) -> None:
    """The answer's text grew in steps while streaming: at least two growing lengths before ``done`` (which
    may then show the server's final, stripped answer)."""
    assert chunks >= 2, f"#answer data-chunks={chunks}: expected at least two token events"
    lengths = [e["len"] for e in log if e["state"] == "streaming" and e["len"] > 0]
    assert lengths == sorted(lengths), f"#answer text shrank while streaming: {log}"
    assert len(set(lengths)) >= 2, f"#answer did not grow piece by piece while streaming: {log}"


def test_ingest_ask_with_enter_stream_and_delete(driver, server, tmp_path):
    _open(driver, server)
    assert driver.execute_script(NO_HORIZONTAL_SCROLL_JS), "horizontal scrollbar at 1280x800"
    for doc_id, (title, text) in DOCS.items():
        _add_with_form(driver, doc_id, title, text)
        _wait(driver, lambda d, doc_id=doc_id: doc_id in d.execute_script(DOC_STATUS_JS), f"li.doc {doc_id}")
    note = tmp_path / "volcano.txt"
    note.write_text(VOLCANO)
    _by_id(driver, "doc-file").send_keys(str(note))  # .txt: one document, id = file name, title = stem
    expected = {"lighthouse", "paris", "volcano.txt"}
    _wait(driver, _all_ready(expected), "three documents ready")
    assert _css(driver, 'li.doc[data-doc-id="volcano.txt"] .doc-title').text == "volcano"  # title = stem

    driver.execute_script(ANSWER_LOG_JS)
    state = _ask(driver, QUESTION)
    assert state == "done", f"#answer data-state={state}, #error: {_error_text(driver)!r}"
    answer = _by_id(driver, "answer")
    _assert_streamed_incrementally(driver.execute_script("return window.__answerLog"),
                                   int(answer.get_attribute("data-chunks")))
    used = driver.execute_script(USED_DOCS_JS)
    assert used and "lighthouse" in [doc_id for doc_id, _ in used], used
    assert {doc_id for doc_id, _ in used} <= driver.execute_script(DOC_STATUS_JS).keys()
    assert all(cache == "hit" for _, cache in used), used  # every document was ready: served from its cache
    shares = driver.execute_script(SHARES_JS)  # explained by default: per-document attribution, top passages
    assert len(shares) == len(used) and all(0 <= s <= 1 for s in shares), shares
    assert abs(sum(shares) - 1) < 1e-3 or sum(shares) == 0, shares
    assert "left out" in _by_id(driver, "used-method").text
    _wait(driver, lambda d: d.execute_script(PASSAGES_JS), "quoted passages under the documents used")
    assert all(q.startswith("\u201c") and q.endswith("\u201d") for q in driver.execute_script(PASSAGES_JS))
    timings = {name: driver.execute_script(
        f"return document.querySelector('#timings [data-timing=\"{name}\"]')?.textContent.trim() || ''")
        for name in ("retrieval_s", "cache_load_s", "link_s", "ttft_s", "total_s", "queue_wait_s")}
    assert all(any(ch.isdigit() for ch in text) for text in timings.values()), timings
    assert _error_text(driver) == ""
    if os.environ.get("KVLINK_RAG_SCREENSHOT"):
        driver.save_screenshot(os.environ["KVLINK_RAG_SCREENSHOT"])

    _css(driver, '#doc-list li.doc[data-doc-id="paris"] button.doc-delete').click()
    _wait(driver, lambda d: "paris" not in d.execute_script(DOC_STATUS_JS), "li.doc paris to disappear")
    assert driver.execute_script(DOC_STATUS_JS).keys() >= {"lighthouse", "volcano.txt"}
    assert _http_status(f"{server.url}/v1/documents/paris") == 404


def test_ticked_documents_and_the_comparison_with_full_prefill(driver, server):
    batch = [{"id": "ferry", "title": "Ferry", "text": "The ferry to the island leaves at noon every day."},
             {"id": "tide", "title": "Tide", "text": "High tide at the harbour is at six in the evening."},
             {"id": "mill", "title": "Mill", "text": "The old mill by the river grinds wheat into flour."}]
    assert _http_status(f"{server.url}/v1/documents", {"documents": batch}) == 202
    _open(driver, server)
    _wait(driver, _all_ready([doc["id"] for doc in batch]), "three documents ready")
    for doc_id in ("tide", "ferry"):  # ticked out of list order: the prompt follows the ticking
        _css(driver, f'li.doc[data-doc-id="{doc_id}"] input.doc-select').click()
    _by_id(driver, "compare").click()
    _type(driver, "question", "When does the ferry leave?")
    _by_id(driver, "ask").click()
    _wait(driver, lambda d: _by_id(d, "answer-full").get_attribute("data-state") in ("done", "error"), "both answers")
    assert _by_id(driver, "answer").get_attribute("data-state") == "done", _error_text(driver)
    assert _by_id(driver, "answer-full").get_attribute("data-state") == "done", _error_text(driver)
    assert int(_by_id(driver, "answer-full").get_attribute("data-chunks")) >= 1
    assert [doc_id for doc_id, _ in driver.execute_script(USED_DOCS_JS)] == ["tide", "ferry"]
    compare = _by_id(driver, "ttft-compare").text
    assert re.fullmatch(r"TTFT linked [\d.]+ ms \(\d+ of \d+ prompt tokens cached\) vs full cold [\d.]+ ms \([\d.]+x\)",
                        compare), compare  # mode full is cold (KVLINK_RAG_FULL_MODE_CACHED off)


def test_narrow_mobile_layout_has_no_horizontal_scroll(driver, server):
    driver.set_window_size(390, 844)
    _open(driver, server)
    assert driver.execute_script("return window.innerWidth") <= 390
    assert driver.execute_script(NO_HORIZONTAL_SCROLL_JS), "horizontal scrollbar at 390 px wide"
    for element_id in ("question", "ask", "doc-text", "doc-add"):
        element = _by_id(driver, element_id)
        assert element.is_displayed(), f"#{element_id} hidden at 390 px"
        right = driver.execute_script("return arguments[0].getBoundingClientRect().right", element)
        assert right <= 390, f"#{element_id} reaches x={right} at 390 px wide"
    # an error raised from the ask panel is brought into view (on a phone the banner sits far above it)
    _by_id(driver, "ask").click()
    _wait(driver, lambda d: _error_text(d) == "type a question first", "the empty-question message")
    top = driver.execute_script("return document.getElementById('error').getBoundingClientRect().top")
    assert -1 <= top < 844, f"#error at y={top}, outside the 844 px viewport"  # sub-pixel rounding


def test_api_errors_are_shown_readably_and_the_key_fixes_them(driver, keyed_server):
    _open(driver, keyed_server)
    _add_with_form(driver, "ferry", "Ferry", "The ferry to the island leaves at noon.")
    message = _wait(driver, lambda d: "API key" in (text := _error_text(d)) and text, "#error naming the API key")
    assert message.startswith("missing API key") and "{" not in message, f"#error: {message!r}"
    assert driver.execute_script(DOC_STATUS_JS) == {}

    _type(driver, "api-key", "k1")
    _add_with_form(driver, "ferry", "Ferry", "The ferry to the island leaves at noon.")
    _wait(driver, lambda d: "ferry" in d.execute_script(DOC_STATUS_JS), "li.doc ferry after the key was given")
    assert _error_text(driver) == ""

    limit = keyed_server.server.config.app.state.service.settings.max_document_chars
    _add_with_form(driver, "long", "Long", "x" * (limit + 1))  # the ingest route refuses it (413)
    message = _wait(driver, _error_text, "#error after a too long document")
    assert message == (f"document 'long' has {limit + 1} characters; the limit is {limit} "
                       "(KVLINK_RAG_MAX_DOCUMENT_CHARS)")
    assert "long" not in driver.execute_script(DOC_STATUS_JS)
