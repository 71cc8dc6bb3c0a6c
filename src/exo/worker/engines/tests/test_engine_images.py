"""A runner whose engine reads no images refuses a request carrying one (never answers as
if the image were not there)."""

from pathlib import Path

from exo.api.images import decode_image
from exo.api.tests.test_images import image_bytes
from exo.shared.models.embedded import EMBEDDED_MODEL_ID
from exo.shared.types.chunks import ErrorChunk
from exo.shared.types.common import CommandId
from exo.shared.types.events import ChunkGenerated
from exo.shared.types.tasks import TaskId, TextGeneration
from exo.shared.types.text_generation import InputMessage, TextGenerationTaskParams
from exo.shared.types.worker.instances import InstanceId
from exo.worker.engines.engine import load_engine
from exo.worker.runner.generation import Generation


def test_a_text_engine_refuses_images(gguf_path: Path, tokenizer_cache: Path) -> None:
    gen = Generation(load_engine(gguf_path, threads=1, cache_dir=tokenizer_cache), max_batch=1)
    image = decode_image(image_bytes("PNG"))
    message = InputMessage(role="user", content="what is this?", images=[image])
    task = TextGeneration(
        task_id=TaskId("img"),
        instance_id=InstanceId("instance"),
        command_id=CommandId("img"),
        task_params=TextGenerationTaskParams(model=EMBEDDED_MODEL_ID, input=[message]),
    )
    chunks = [e.chunk for e in gen.submit(task) if isinstance(e, ChunkGenerated)]
    assert len(chunks) == 1 and isinstance(chunks[0], ErrorChunk)
    assert chunks[0].error_code == "invalid_request" and "images" in chunks[0].error_message
    assert gen.active == 0
