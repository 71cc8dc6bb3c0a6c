"""Embeddings through the official clients against a scripted node (its runner answers a
fixed unit vector): the task each input becomes, both OpenAI encodings, Ollama's shapes."""

import base64
import struct

import httpx
import ollama
import openai
import pytest

from exo.api.embeddings import as_base64
from exo.api.tests.scripted_node import PROMPT_TOKENS, ScriptedNode, ServedApp

VECTOR = [0.6, 0.8]  # what the scripted runner answers


def oa(server: ServedApp) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=10)


def test_openai_embeddings_each_input_is_one_embed_task(
    server: ServedApp, node: ScriptedNode
) -> None:
    out = oa(server).embeddings.create(model="m1", input=["a b", "c"])  # base64 on the wire
    # float32 on the wire
    assert [d.embedding for d in out.data] == [pytest.approx(VECTOR, abs=1e-7)] * 2
    assert [d.index for d in out.data] == [0, 1]
    assert out.usage.prompt_tokens == 2 * PROMPT_TOKENS
    tasks = [g.task_params for g in node.generations[-2:]]
    assert [(t.embed, t.raw_prompt) for t in tasks] == [(True, "a b"), (True, "c")]
    floats = httpx.post(
        f"{server.url}/v1/embeddings", json={"model": "m1", "input": "x"}, timeout=10
    ).json()
    assert floats["object"] == "list" and floats["data"][0]["embedding"] == VECTOR


def test_base64_is_little_endian_float32() -> None:
    encoded = as_base64([1.0, -2.5])
    assert struct.unpack("<2f", base64.b64decode(encoded)) == (1.0, -2.5)


def test_ollama_embed_shapes(server: ServedApp) -> None:
    client = ollama.Client(host=server.url, timeout=10)
    out = client.embed(model="m1:latest", input=["a", "b"])
    assert [list(v) for v in out.embeddings] == [VECTOR, VECTOR]
    assert out.prompt_eval_count == 2 * PROMPT_TOKENS
    assert list(client.embeddings(model="m1", prompt="a").embedding) == VECTOR
    r = httpx.post(f"{server.url}/api/embed", json={"model": "m1", "input": []}, timeout=10)
    assert r.status_code == 400 and "input" in r.json()["error"]


def test_openai_token_id_inputs_become_embed_tasks_of_those_ids(
    server: ServedApp, node: ScriptedNode
) -> None:
    client = oa(server)
    out = client.embeddings.create(model="m1", input=[[12, 34, 56], [7]])
    assert len(out.data) == 2
    tasks = [g.task_params for g in node.generations[-2:]]
    assert [(t.embed, t.context_tokens) for t in tasks] == [(True, [12, 34, 56]), (True, [7])]
    client.embeddings.create(model="m1", input=[12, 34])  # one input, as an id array
    assert node.generations[-1].task_params.context_tokens == [12, 34]
    for bad in ([[]], [[1, -1]], [["a"]], [[1.5]], [True]):
        r = httpx.post(f"{server.url}/v1/embeddings", json={"model": "m1", "input": bad})
        assert r.status_code == 400, (bad, r.text)
        assert r.json()["error"]["param"].startswith("input")
    # Ollama embeds text only, as Ollama does.
    r = httpx.post(f"{server.url}/api/embed", json={"model": "m1", "input": [[1, 2]]})
    assert r.status_code == 400
