"""A long document through the API: stored as chunk caches, queried as one document, an update replaces
the edited paragraph's chunk and every chunk after it (encoded after the caches of the chunks before it)."""

from __future__ import annotations

import random

from api_helpers import wait_ready
from service_support import wait_for

WORDS = "harbour lantern granite meadow falcon copper willow ember quarry saddle orchard tidal basalt".split()


def test_a_long_document_is_cached_as_chunks_and_an_update_replaces_one(client):
    rng = random.Random(0)
    paras = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60))) + "." for _ in range(30)]
    assert client.post("/v1/documents", json={"id": "notes", "text": "\n\n".join(paras)}).status_code == 202
    keys = wait_ready(client, "notes")["cache_key"].split()
    assert len(keys) > 2
    for batched in (True, False):  # all documents, and retention below 1 (its own layout in the scheduler)
        ask = {"question": "Which stone?", "document_ids": ["notes"], "max_new_tokens": 2}
        r = client.post("/v1/query", json=ask if batched else {**ask, "retention": 0.9})
        assert r.status_code == 200, r.text
        assert [(d["id"], d["cache_hit"]) for d in r.json()["documents"]] == [("notes", True)]

    paras[15] += " This paragraph was edited."
    assert client.post("/v1/documents", json={"id": "notes", "text": "\n\n".join(paras)}).status_code == 202
    done = wait_for(lambda: (d := client.get("/v1/documents/notes").json())["status"] == "ready" and d["version"] == 2
                    and d, 30, what="version 2 ready")
    new = done["cache_key"].split()
    # the edited paragraph's chunk and every chunk after it (each encoded after the caches of the chunks before it,
    # the default); the chunks before it keep their keys
    same = [k == n for k, n in zip(keys, new)]
    edited = same.index(False)
    assert len(new) == len(keys) and 0 < edited < len(keys) - 1 and not any(same[edited:])
    assert set(new) - set(keys) == set(new[edited:]) and set(keys) - set(new) == set(keys[edited:])
    # the old version's chunks are dropped just after the new version is marked ready (service/precompute.py)
    wait_for(lambda: sorted(client.app_state.store.blobs.keys()) == sorted(set(new)), 10, what="old chunks dropped")
