"""The worker's downloads: a DownloadModel task, or a user's start / cancel / delete,
turned into files on disk and ``NodeDownloadProgress`` events.

Hub models download in the background (one download per model at a time) so the
worker keeps planning; models with a local source are only located. A failure that
retrying cannot fix deletes the instance that waited for it, so its requests end now.
"""

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskGroup
from loguru import logger

from exo.shared.models.model_cards import ModelCard, ModelId
from exo.shared.types.commands import Command, DeleteInstance, DownloadActionKind
from exo.shared.types.common import NodeId
from exo.shared.types.events import Event, NodeDownloadProgress
from exo.shared.types.state import State
from exo.shared.types.tasks import DownloadModel
from exo.shared.types.worker.downloads import (
    DownloadCompleted,
    DownloadFailed,
    DownloadOngoing,
    DownloadPending,
    DownloadProgress,
    holds_shard,
)
from exo.shared.types.worker.instances import InstanceId
from exo.shared.types.worker.shards import layer_range
from exo.utils.backoff import KeyedBackoff
from exo.worker.download.hub import HubSettings, delete_hub_model, locate_hub_model
from exo.worker.download.hub_names import hub_source_problem
from exo.worker.download.local import locate_model, locate_progress
from exo.worker.download.shard_download import ShardDownload
from exo.worker.runner.settings import RunnerSettings

_CAUSE_FIRST_S = 3.0
"""How long a failed instance's deletion waits for its download failure to be in the state."""


@dataclass(eq=False)
class DownloadCoordinator:
    node_id: NodeId
    settings: RunnerSettings
    send_event: Callable[[Event], Awaitable[None]]
    send_command: Callable[[Command], Awaitable[None]]
    backoff: KeyedBackoff[ModelId]
    state: Callable[[], State]
    wakeup: Callable[[], None]
    task_group: TaskGroup
    running: dict[ModelId, ShardDownload] = field(default_factory=dict[ModelId, ShardDownload])
    reported: dict[ModelId, DownloadProgress] = field(
        default_factory=dict[ModelId, DownloadProgress]
    )
    """The last progress this node reported for each model: what it reports again when
    the cluster's state lacks it (a merge dropped the event)."""

    async def download(self, task: DownloadModel) -> None:
        """Make this node hold the files of the task's shard: a hub model's missing
        files are fetched (the ones it holds are checked and kept)."""
        card = task.shard_metadata.model_card
        s = self.settings
        layers = layer_range(task.shard_metadata)
        refused = _refused(card)
        if refused is not None:
            await self._report(card, refused)
            await self._fail_instance(task.instance_id, card.model_id, refused)
            return
        if holds_shard(self.reported.get(card.model_id), task.shard_metadata):
            # Done here, its completion still on its way through the log: the planner,
            # woken as the download ended, asks again on a state that lacks it. Starting
            # over would report it Ongoing again and the state would never settle (each
            # end started another). A merge that drops the event: ``reported`` re-sends it.
            return
        if card.hub is not None and locate_model(
            card, s.models_dir, None, s.extra_model_dirs, layers
        ) is None:
            if card.model_id not in self.running:
                self.backoff.record_attempt(card.model_id, time.monotonic())
                self._start(card, *layers, task.instance_id)
            return
        self.backoff.record_attempt(card.model_id, time.monotonic())
        progress = await anyio.to_thread.run_sync(
            locate_progress, card, s.models_dir, s.hub_cache_dir, s.extra_model_dirs, layers
        )
        if isinstance(progress, DownloadCompleted):
            self.backoff.reset(card.model_id)
        await self._report(card, progress)
        await self._fail_instance(task.instance_id, card.model_id, progress)

    def action(self, action: DownloadActionKind, card: ModelCard) -> None:
        """A user asked this node to start, cancel or delete a model's download."""
        if _refused(card) is not None:
            return
        match action:
            case "start":
                if card.hub is not None and card.model_id not in self.running:
                    self._start(card, 0, card.n_layers, None)
            case "cancel":
                self.cancel(card.model_id)
            case "delete":
                self.cancel(card.model_id)
                self.reported.pop(card.model_id, None)  # the state forgets it too (apply)
                cache = self.settings.hub_cache_dir
                if cache is not None:

                    async def delete() -> None:
                        await anyio.to_thread.run_sync(delete_hub_model, card, cache)

                    self.task_group.start_soon(delete)

    def cancel(self, model_id: ModelId) -> bool:
        download = self.running.get(model_id)
        if download is None:
            return False
        download.cancelled_by_user = True
        download.cancelled.set()
        return True

    def _start(self, card: ModelCard, start: int, end: int, instance_id: InstanceId | None) -> None:
        download = ShardDownload(card, start, end, HubSettings.from_env(self.settings.hub_cache_dir))
        self.running[card.model_id] = download
        held = self.state().downloads.get(self.node_id, {}).get(card.model_id)

        async def run() -> None:
            try:
                await self._report(card, DownloadOngoing(downloaded_bytes=0, total_bytes=0))
                outcome = await download.run(lambda p: self._report(card, p))
                if isinstance(outcome, DownloadCompleted):
                    self.backoff.reset(card.model_id)
                    outcome = await anyio.to_thread.run_sync(self._widest, card, outcome, held)
                if download.cancelled_by_user:
                    outcome = DownloadPending()
                await self._report(card, outcome)
                if instance_id is not None:
                    await self._fail_instance(instance_id, card.model_id, outcome)
            finally:
                self.running.pop(card.model_id, None)
                self.wakeup()

        self.task_group.start_soon(run)

    def _widest(
        self, card: ModelCard, done: DownloadCompleted, held: DownloadProgress | None
    ) -> DownloadCompleted:
        """What this node holds after fetching a shard: the whole model, or the shard
        joined with what it held before, when those files are all in the cache (so that
        two shards of one model on this node do not take turns re-checking files)."""
        cache = self.settings.hub_cache_dir
        if cache is None or done.start_layer is None or done.end_layer is None:
            return done
        candidates = [(0, card.n_layers)]
        if isinstance(held, DownloadCompleted) and held.start_layer is not None and (
            held.end_layer is not None
        ):
            candidates.append(
                (min(held.start_layer, done.start_layer), max(held.end_layer, done.end_layer))
            )
        for start, end in candidates:
            if (start, end) != (done.start_layer, done.end_layer) and locate_hub_model(
                card, cache, (start, end)
            ) is not None:
                return done.model_copy(update={"start_layer": start, "end_layer": end})
        return done

    async def _fail_instance(
        self, instance_id: InstanceId, model_id: ModelId, outcome: DownloadProgress
    ) -> None:
        """Retrying cannot help: fail the instance (and its waiting requests) now."""
        if not (
            isinstance(outcome, DownloadFailed)
            and outcome.terminal
            and instance_id in self.state().instances
        ):
            return
        # The failure (an event) and the deletion (a command) travel apart: a request that
        # sees the instance gone must already see why, so the deletion waits (a little) for
        # the failure to be in the cluster's state.
        with anyio.move_on_after(_CAUSE_FIRST_S):
            while self.state().downloads.get(self.node_id, {}).get(model_id) != outcome:
                await anyio.sleep(0.02)
        if instance_id in self.state().instances:
            await self.send_command(
                DeleteInstance(instance_id=instance_id, reason=outcome.error_message)
            )

    async def _report(self, card: ModelCard, progress: DownloadProgress) -> None:
        self.reported[card.model_id] = progress
        await self.send_event(
            NodeDownloadProgress(node_id=self.node_id, model_id=card.model_id, progress=progress)
        )


def _refused(card: ModelCard) -> DownloadFailed | None:
    """A card from the wire whose hub names would lead out of the cache: refused before
    any path is built from it (a card built here from the hub was checked already)."""
    problem = hub_source_problem(card.hub) if card.hub is not None else None
    if problem is None:
        return None
    logger.warning(f"refusing the card of {card.model_id}: {problem}")
    return DownloadFailed(error_message=f"{card.model_id}: refused: {problem}", status=400)
