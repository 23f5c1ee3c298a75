"""Clients that leave (real sockets, uvicorn) cancel their queries: plain and streamed queries waiting for a busy
model release their slots at once, and none of them loads or encodes its documents afterwards."""

from __future__ import annotations

import threading
import time

import httpx

from api.main import create_app
from api_helpers import service_settings
from factories import tiny_text_engine
from service_support import LiveServer, wait_for


def _leave_after(url: str, body: dict, after_s: float) -> None:
    """POST ``body`` and close the connection after ``after_s`` seconds without an answer."""
    try:
        with httpx.Client(timeout=httpx.Timeout(after_s, connect=5.0)) as client:
            if body.get("stream"):
                with client.stream("POST", f"{url}/v1/query", json=body) as r:
                    for _ in r.iter_bytes():
                        pass
            else:
                client.post(f"{url}/v1/query", json=body)
    except httpx.TimeoutException:
        return
    raise AssertionError("answered although the model was busy")


def test_clients_that_leave_release_their_slots_and_load_nothing(tmp_path):
    engine = tiny_text_engine(tmp_path / "engine", max_new_tokens=4)
    encoded = []
    encode = engine.encode
    engine.encode = lambda doc: (encoded.append(doc.text), encode(doc))[1]
    app = create_app(service_settings(tmp_path / "home", precompute_threads=0), engine)
    docs = [{"id": f"d{i}", "text": f"Harbour number {i} had {i + 2} cranes and a red lighthouse."} for i in range(8)]
    with LiveServer(app) as server:
        state = app.state.service
        httpx.post(f"{server.url}/v1/documents", json={"documents": docs}, timeout=30).raise_for_status()
        bodies = [{"question": "How many cranes?", "document_ids": [f"d{i}", f"d{(i + 1) % 8}"], "stream": i % 2 == 0}
                  for i in range(8)]
        with state.model_lock:  # the model is busy (a long step, a precompute chunk): the queries wait
            clients = [threading.Thread(target=_leave_after, args=(server.url, b, 0.3)) for b in bodies]
            for t in clients:
                t.start()
            for t in clients:
                t.join(30)
            wait_for(lambda: state.gates.model.borrowed_tokens == 0, 10, interval=0.02,
                     what="the cancelled queries' slots released while the model is still busy")
        sched = state.runtime.scheduler
        wait_for(lambda: not sched.busy(), 10, what="the scheduler idle")
        time.sleep(0.3)  # a step that had chosen them before they left ends without admitting them
        assert encoded == []  # none of the 8 queries loaded or encoded a document after its client left
        r = httpx.post(f"{server.url}/v1/query", json={"question": "How many cranes?", "document_ids": ["d3"]},
                       timeout=60)
        assert r.status_code == 200 and len(encoded) == 1  # the service goes on serving
