"""The OpenAPI document tells the truth: schemathesis (``st run --checks all``) against a real uvicorn server
(embedded default over the tiny engine, a private home), once without API keys and once with them, finds
no failure.

``positive_data_acceptance`` runs as ``positive_data_within_rules`` (``contract_hooks``): the same check,
less the refusals the server names as rules no JSON schema can express (``api.errors.RULES_BEYOND_SCHEMA``).
A fixed seed and a bounded number of examples keep each run short.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from api.main import create_app
from api_helpers import service_settings
from service_support import LiveServer

HERE = Path(__file__).parent
ST = Path(sys.executable).parent / "st"
KEY = "contract-key"
LIMITS = dict(max_new_tokens_limit=8, max_choices=2)  # short answers: every generated request stays cheap


def schemathesis_run(url: str, workdir: Path, *extra: str) -> subprocess.CompletedProcess:
    """``st run`` over every operation of ``url``'s document: all checks, fixed seed, few examples."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent.parent)]),
           "SCHEMATHESIS_HOOKS": "contract_hooks"}
    args = [str(ST), "run", f"{url}/openapi.json", "--checks", "all", "--exclude-checks", "positive_data_acceptance",
            "--max-examples", "8", "--seed", "30", "--generation-database", "none", "--output-sanitize", "false",
            "--request-timeout", "60", "--no-color", *extra]  # a busy CPU may take seconds per answer
    return subprocess.run(args, cwd=workdir, env=env, capture_output=True, text=True, timeout=1200)


def serve(tmp_path: Path, tiny_engine, **settings):
    return LiveServer(create_app(service_settings(tmp_path / "home", **LIMITS, **settings), tiny_engine))


@pytest.mark.skipif(not ST.exists(), reason="schemathesis is not installed (pip install -e '.[dev]')")
@pytest.mark.parametrize("keys", [False, True], ids=["no-keys", "api-keys"])
def test_schemathesis_finds_no_failure(tmp_path, tiny_engine, keys):
    extra = dict(api_keys={KEY: "tenant-a"}) if keys else {}
    with serve(tmp_path, tiny_engine, **extra) as server:
        # with keys the schema differs only in its security: the fuzzing and stateful phases check it, the
        # coverage phase (the slow one, not bounded by --max-examples) already ran over the same bodies
        headers = ("--header", f"Authorization: Bearer {KEY}", "--phases", "examples,fuzzing,stateful") if keys else ()
        run = schemathesis_run(server.url, tmp_path, *headers)
    (tmp_path / "schemathesis.txt").write_text(run.stdout + run.stderr)  # the whole report, kept with the test
    assert run.returncode == 0, run.stdout[-12000:] + run.stderr[-2000:]


def test_security_follows_the_configuration(tmp_path, tiny_engine):
    """Without keys no operation needs Authorization; with keys every tenant route needs the bearer."""
    from fastapi.testclient import TestClient

    for keys in ({}, {KEY: "tenant-a"}):
        app = create_app(service_settings(tmp_path / f"home{len(keys)}", api_keys=keys), tiny_engine)
        with TestClient(app) as c:
            doc = c.get("/openapi.json").json()
        ops = {(m, p): op for p, item in doc["paths"].items() for m, op in item.items()}
        secured = {k for k, op in ops.items() if "security" in op}
        answers_401 = {k for k, op in ops.items() if "401" in op["responses"]}
        if keys:
            assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
            assert ("get", "/v1/documents") in secured and ("get", "/healthz") not in secured
            assert secured == answers_401
        else:
            assert not secured and not answers_401 and "securitySchemes" not in doc["components"]
        assert "HTTPValidationError" not in json.dumps(doc)  # 422s carry the service's error body
        top_k = doc["components"]["schemas"]["QueryIn"]["properties"]["top_k"]["anyOf"][0]
        assert top_k["maximum"] == 20  # KVLINK_RAG_MAX_TOP_K written into the document


def test_the_schema_roles_are_the_conversation_roles():
    from api.schemas import CHAT_ROLES
    from kvlink_rag.text.conversation import ROLES

    assert CHAT_ROLES == ROLES


def test_the_non_blank_pattern_is_what_str_strip_keeps():
    """``NON_BLANK`` (the schema's "not only whitespace") matches exactly the characters str.strip() keeps."""
    import re

    from api.contract import NON_BLANK

    pattern = re.compile(NON_BLANK)
    assert all((pattern.search(chr(i)) is None) == chr(i).isspace() for i in range(0x110000)
               if not 0xD800 <= i < 0xE000)
