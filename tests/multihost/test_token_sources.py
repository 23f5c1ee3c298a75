"""Per-request accounting: a query's prompt tokens by source (stored caches, of them the shared tier; encoded
now; the prefix tree), on two hosts sharing a cache tier."""


def test_prompt_tokens_are_reported_by_where_they_came_from(make_host, shared_server, documents):
    with make_host("a", shared_server.url()) as a:
        a.client.post("/v1/documents", json={"documents": documents[:2]})
        for d in documents[:2]:
            a.ready(d["id"])
        with make_host("c", shared_server.url()) as c:
            ids = [documents[0]["id"], documents[1]["id"]]
            first = c.query(ids)["token_sources"]
            assert first["document_cache_tokens"] > 0 and first["encoded_tokens"] == 0
            assert first["shared_tier_tokens"] == first["document_cache_tokens"]  # none on c's disk yet
            again = c.query(ids)["token_sources"]  # same documents in the same order: the prefix tree has them
            assert again["prefix_tree_tokens"] >= first["document_cache_tokens"] and again["shared_tier_tokens"] == 0
            c.client.post("/v1/documents", json=documents[2])
            body = c.client.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "Who?"}], "document_ids": [documents[2]["id"]],
                "max_tokens": 2}).json()
            details = body["usage"]["prompt_tokens_details"]
            assert set(details) >= {"cached_tokens", "document_cache_tokens", "encoded_tokens", "prefix_tree_tokens",
                                    "shared_tier_tokens"}
