"""Embeddings and Ollama's generate context against one real node serving the embedded
model, through official clients."""

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest

from exo.tests.node_process import NodeProcess, running_node
from exo.worker.download.embedded import find_embedded_gguf
from exo.worker.engines.tokenizer import load_tokenizer

pytestmark = [pytest.mark.slow]

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
HIDDEN = 576  # SmolLM2-135M's hidden size


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    tmp: Path = tmp_path_factory.mktemp("api-embed")
    with running_node(tmp, timeout=300) as n:
        yield n


def oa(node: NodeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=120)


def norm(v: list[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


def test_openai_sdk_embeddings(node: NodeProcess) -> None:
    client = oa(node)
    # The SDK asks for base64 unless told otherwise, and decodes it.
    both = client.embeddings.create(model=MODEL, input=["The sea is calm.", "def f(): pass"])
    assert [d.index for d in both.data] == [0, 1]
    a, b = (d.embedding for d in both.data)
    assert len(a) == len(b) == HIDDEN and a != b
    assert math.isclose(norm(a), 1.0, rel_tol=1e-4) and math.isclose(norm(b), 1.0, rel_tol=1e-4)
    assert both.usage.prompt_tokens > 0 and both.usage.total_tokens == both.usage.prompt_tokens
    floats = client.embeddings.create(
        model=MODEL, input="The sea is calm.", encoding_format="float"
    )
    assert len(floats.data) == 1
    # The same text gives the same vector, in both encodings (float32 on the wire for base64).
    assert all(
        math.isclose(x, y, abs_tol=1e-6) for x, y in zip(floats.data[0].embedding, a, strict=True)
    )


def test_openai_embedding_errors_are_400(node: NodeProcess) -> None:
    url = node.url + "/v1/embeddings"
    cases: list[dict[str, Any]] = [
        {"model": MODEL, "input": ""},
        {"model": MODEL, "input": []},
        {"model": MODEL, "input": [[1, 2, 10**6]]},  # an id outside the vocabulary
        {"model": MODEL, "input": [1, -2]},
        {"model": MODEL, "input": [[]]},
        {"model": MODEL, "input": "x", "encoding_format": "hex"},
        {"model": MODEL, "input": "x", "dimensions": 7},
        {"model": MODEL, "input": "lorem ipsum " * 1500},
    ]
    for body in cases:
        r = httpx.post(url, json=body, timeout=120)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["message"]
    r = httpx.post(url, json={"model": "no-such-model", "input": "x"}, timeout=120)
    assert r.status_code == 404
    assert httpx.post(url, json={"model": MODEL, "input": "still serving"}, timeout=120).is_success


def test_token_id_input_embeds_the_same_tokens_as_the_text(
    node: NodeProcess, tmp_path: Path
) -> None:
    gguf = find_embedded_gguf()
    assert gguf is not None
    ids = load_tokenizer(gguf, tmp_path).encode("The sea is calm.", add_special_tokens=True)
    client = oa(node)
    text = client.embeddings.create(model=MODEL, input="The sea is calm.", encoding_format="float")
    # As langchain-openai sends it (an array of token-id arrays), and one bare array.
    nested = client.embeddings.create(model=MODEL, input=[ids], encoding_format="float")
    bare = client.embeddings.create(model=MODEL, input=ids, encoding_format="float")
    assert nested.usage.prompt_tokens == bare.usage.prompt_tokens == len(ids)
    for out in (nested, bare):
        assert all(
            math.isclose(x, y, abs_tol=1e-6)
            for x, y in zip(out.data[0].embedding, text.data[0].embedding, strict=True)
        )
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model=MODEL, input=[[12, 34, 10**6]])
    body: Any = info.value.body
    assert body["param"] == "input" and "vocabulary" in body["message"]


def test_ollama_embed_and_legacy_embeddings(node: NodeProcess) -> None:
    client = ollama.Client(host=node.url, timeout=120)
    out = client.embed(model=MODEL, input=["The sea is calm.", "The sea is calm."])
    vectors = [list(v) for v in out.embeddings]
    assert len(vectors) == 2 and vectors[0] == vectors[1] and len(vectors[0]) == HIDDEN
    assert math.isclose(norm(vectors[0]), 1.0, rel_tol=1e-4)
    assert (out.prompt_eval_count or 0) > 0
    legacy = client.embeddings(model=MODEL, prompt="The sea is calm.")
    assert list(legacy.embedding) == vectors[0]
    one = client.embed(model=MODEL + ":latest", input="The sea is calm.")
    assert list(one.embeddings[0]) == vectors[0]
    # Ollama cuts an input over the context to fit, unless told not to.
    long = "lorem ipsum " * 1500
    cut = client.embed(model=MODEL, input=long)
    assert cut.prompt_eval_count == 2048 and len(cut.embeddings[0]) == HIDDEN
    with pytest.raises(ollama.ResponseError) as info:
        client.embed(model=MODEL, input=long, truncate=False)
    assert info.value.status_code == 400 and "2048" in info.value.error


def test_ollama_generate_returns_its_context(node: NodeProcess, tmp_path: Path) -> None:
    client = ollama.Client(host=node.url, timeout=120)
    options: dict[str, Any] = {"temperature": 0, "num_predict": 6}
    whole = client.generate(model=MODEL, prompt="Name a colour.", options=options, stream=False)
    context = list(whole.context or [])
    prompt_n, output_n = whole.prompt_eval_count or 0, whole.eval_count or 0
    assert whole.done_reason == "length" and output_n == 6
    assert len(context) == prompt_n + output_n
    gguf = find_embedded_gguf()
    assert gguf is not None
    tokenizer = load_tokenizer(gguf, tmp_path)
    assert tokenizer.decode(context[prompt_n:]) == whole.response
    streamed = list(
        client.generate(model=MODEL, prompt="Name a colour.", options=options, stream=True)
    )
    assert list(streamed[-1].context or []) == context
    assert all(part.context is None for part in streamed[:-1])
