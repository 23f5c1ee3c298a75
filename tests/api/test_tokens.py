"""vLLM's operational endpoints: /version, /tokenize, /detokenize, and /v1/models naming the tokenizer."""

from __future__ import annotations

from pathlib import Path


def test_tokenize_and_detokenize_round_trip_and_count_as_the_generation_routes_do(client):
    assert client.get("/version").json()["version"] == "0.1.0"
    tok = client.post("/tokenize", json={"prompt": "The capital of France is"}).json()
    assert tok["count"] == 5 == len(tok["tokens"]) and tok["max_model_len"] == 2048
    assert client.post("/detokenize", json={"tokens": tok["tokens"]}).json() == {"prompt": "The capital of France is"}
    done = client.post("/v1/completions", json={"prompt": "The capital of France is", "max_tokens": 1}).json()
    assert done["usage"]["prompt_tokens"] == tok["count"]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello, who are you?"}]
    chat = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1}).json()
    assert chat["kvlink"]["documents"] == []  # a plain chat, prompted as /tokenize counts it
    assert client.post("/tokenize", json={"messages": messages}).json()["count"] == chat["usage"]["prompt_tokens"]
    for bad, message in (({}, "either prompt or messages"), ({"prompt": "x", "messages": messages}, "either"),
                         ({"messages": [{"role": "assistant", "content": "x"}]}, "user message")):
        r = client.post("/tokenize", json=bad)
        assert r.status_code == 422 and message in r.json()["error"]["message"], r.text
    r = client.post("/detokenize", json={"tokens": [-1]})
    assert r.status_code == 422 and "outside the vocabulary" in r.json()["error"]["message"]


def test_models_names_the_folder_holding_the_tokenizer(client):
    model = client.get("/v1/models").json()["data"][0]
    assert model["id"] == "kvlink-rag" and model["max_model_len"] == 2048
    assert (Path(model["root"]) / "tokenizer_config.json").is_file()
