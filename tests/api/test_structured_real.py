"""response_format with the real default model (SmolLM2) through the openai client against a real uvicorn:
the answer parses as JSON / validates against the schema, greedy and sampled, streamed and with n."""

from __future__ import annotations

import json

import openai
import pytest

from api.main import create_app
from api_helpers import service_settings
from factories import real_engine
from service_support import LiveServer

pytestmark = pytest.mark.e2e

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                           "country": {"type": "string", "maxLength": 40},
                                           "population_millions": {"type": "number"}},
          "required": ["city", "country", "population_millions"], "additionalProperties": False}


def _valid(value: dict) -> bool:
    """``value`` against :data:`SCHEMA` (checked by hand: no validator package in the dependencies)."""
    return (set(value) == set(SCHEMA["required"]) and isinstance(value["city"], str) and len(value["city"]) <= 40
            and isinstance(value["country"], str) and len(value["country"]) <= 40
            and isinstance(value["population_millions"], (int, float)))


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    home = tmp_path_factory.mktemp("structured")
    app = create_app(service_settings(home / "home"), real_engine(home / "engine", max_new_tokens=64))
    with LiveServer(app) as srv:
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)


def _ask(client, **kw):
    return client.chat.completions.create(model="kvlink-rag", max_tokens=64, messages=[
        {"role": "user", "content": "Describe Paris as JSON with its city name, country and population in millions."}],
        **kw)


def test_json_schema_answers_validate_greedy_sampled_and_streamed(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}}
    greedy = _ask(client, response_format=fmt, temperature=0)
    assert greedy.choices[0].finish_reason == "stop", greedy
    assert _valid(json.loads(greedy.choices[0].message.content)), greedy.choices[0].message.content
    sampled = _ask(client, response_format=fmt, temperature=1.0, seed=4, n=2)
    for c in sampled.choices:
        assert c.finish_reason == "stop" and _valid(json.loads(c.message.content)), c.message.content
    chunks = list(_ask(client, response_format=fmt, temperature=0, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert json.loads(text) == json.loads(greedy.choices[0].message.content)
    guided = _ask(client, temperature=0, extra_body={"guided_json": SCHEMA})
    assert guided.choices[0].message.content == greedy.choices[0].message.content


def test_json_object_answers_parse_on_chat_and_completions(client):
    chat = client.chat.completions.create(model="kvlink-rag", max_tokens=48, temperature=0, messages=[
        {"role": "user", "content": 'What is the capital of France? Reply with a JSON object with the key "answer".'}],
        response_format={"type": "json_object"})
    assert chat.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(chat.choices[0].message.content), dict), chat.choices[0].message.content
    prompt = 'Q: the capital of Italy, as JSON.\nA: {"capital": "Rome"}\nQ: the capital of France, as JSON.\nA:'
    free = client.completions.create(model="kvlink-rag", prompt=prompt, max_tokens=48, temperature=0)
    with pytest.raises(json.JSONDecodeError):  # unconstrained, the model goes on past the object
        json.loads(free.choices[0].text)
    done = client.completions.create(model="kvlink-rag", prompt=prompt, max_tokens=48,
                                     temperature=0, extra_body={"response_format": {"type": "json_object"}})
    assert done.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(done.choices[0].text), dict), done.choices[0].text
