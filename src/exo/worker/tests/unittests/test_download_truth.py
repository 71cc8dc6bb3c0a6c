"""A node reports its download progress again when the cluster's state lacks it: a merge
drops the stretch of a stepping-down master's log that held it (chaos merge test), and a
node taken for gone comes back without its downloads. The runner was past idle then, so
nothing would ever ask for that download again."""

from pathlib import Path

import anyio
import pytest

from exo.shared.models.model_cards import ModelCard, ModelId
from exo.shared.tests.builders import INSTANCE_1, NODE_A, make_state
from exo.shared.types.commands import Command
from exo.shared.types.common import NodeId
from exo.shared.types.events import ChunkGenerated, Event, NodeDownloadProgress
from exo.shared.types.memory import Memory
from exo.shared.types.tasks import DownloadModel
from exo.shared.types.worker.downloads import DownloadFailed
from exo.shared.types.worker.shards import PipelineShardMetadata
from exo.utils.channels import channel
from exo.worker.main import Worker
from exo.worker.runner.settings import RunnerSettings


@pytest.mark.anyio
async def test_a_download_the_state_lacks_is_reported_again(tmp_path: Path) -> None:
    card = ModelCard(
        model_id=ModelId("absent-model"), n_layers=2, hidden_size=64, num_heads=2,
        num_kv_heads=2, storage_size=Memory.from_mb(1), context_length=128,
        architecture="llama", source=str(tmp_path / "absent.gguf"),  # no such file
    )
    shard = PipelineShardMetadata(model_card=card, device_rank=0, world_size=1,
                                  start_layer=0, end_layer=2, n_layers=2)
    events_tx, events_rx = channel[Event]()
    commands_tx, _commands_rx = channel[Command]()

    def chunk_sink(event: ChunkGenerated, origin: NodeId | None) -> None:
        raise AssertionError(f"no chunk expected: {event}")

    worker = Worker(
        NODE_A, RunnerSettings(cache_dir=tmp_path / "cache", models_dir=tmp_path / "models"),
        events_tx, commands_tx, chunk_sink,
    )
    assert worker.download_truth(make_state()) == []  # nothing reported yet
    received: list[Event] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(30):
            while not hasattr(worker, "downloads"):
                await anyio.sleep(0.01)
            await worker.downloads.download(
                DownloadModel(instance_id=INSTANCE_1, shard_metadata=shard)
            )
            received.append(await events_rx.receive())
        tg.cancel_scope.cancel()
    sent = received[0]
    assert isinstance(sent, NodeDownloadProgress) and sent.model_id == card.model_id
    assert isinstance(sent.progress, DownloadFailed)

    # The state lacks it (dropped by a merge): the same fact again.
    assert worker.download_truth(make_state()) == [sent]
    # The state holds it: nothing to say.
    held = make_state(downloads={NODE_A: {card.model_id: sent.progress}})
    assert worker.download_truth(held) == []
    # The state holds an older progress of it: the latest again.
    older = make_state(downloads={NODE_A: {card.model_id: DownloadFailed(error_message="x")}})
    assert worker.download_truth(older) == [sent]
    # A user deleted it (the state forgets it as the deletion applies): nothing to restore.
    worker.downloads.action("delete", card)
    assert worker.download_truth(make_state()) == []
