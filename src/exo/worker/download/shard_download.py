"""One shard's download from the hub, run by the worker in a thread, its progress reported
as ``NodeDownloadProgress`` events (at most one every ``interval_s`` per download)."""

import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from loguru import logger

from exo.shared.models.hub_files import mmproj_file, model_gguf_files
from exo.shared.models.model_cards import ModelCard
from exo.shared.types.worker.downloads import (
    DownloadCompleted,
    DownloadFailed,
    DownloadOngoing,
    DownloadProgress,
)
from exo.worker.download.hub import (
    DownloadCancelled,
    DownloadError,
    HubSettings,
    download_files,
    explain,
    locate_hub_model,
    shard_files,
)
from exo.worker.download.shard_gguf import GGUFShardFetch, RangeIgnored, place_mmproj

Report = Callable[[DownloadProgress], Awaitable[None]]


@dataclass
class ShardDownload:
    card: ModelCard
    start_layer: int
    end_layer: int
    settings: HubSettings
    interval_s: float = 0.5
    cancelled: threading.Event = field(default_factory=threading.Event)
    cancelled_by_user: bool = False
    done_bytes: int = 0
    total_bytes: int = 0

    def _count(self, n: int) -> None:
        self.done_bytes += n

    def _fetch(self) -> Path:
        if self._shard_only():
            try:
                return self._fetch_gguf_shard()
            except RangeIgnored:
                logger.warning(f"{self.card.model_id}: the hub ignores Range requests; "
                               "fetching the whole GGUF file instead of the shard's tensors")
                self.done_bytes = 0
        files = shard_files(self.card, self.start_layer, self.end_layer, self.settings)
        self.total_bytes = sum(f.size for f in files)
        return download_files(self.card, files, self.settings, self._count, self.cancelled)

    def _shard_only(self) -> bool:
        """A GGUF model of which this node holds only some layers (and that it does not
        hold whole already), or a split GGUF: fetch only the shard's tensors (the parts of a
        split file are joined into one shard file)."""
        hub = self.card.hub
        if hub is None or hub.gguf_quant is None or self.settings.offline:
            return False
        if len(model_gguf_files(hub.files)) > 1:
            return True
        whole = (self.start_layer, self.end_layer) == (0, self.card.n_layers)
        return not whole and locate_hub_model(self.card, self.settings.cache_dir) is None

    def _fetch_gguf_shard(self) -> Path:
        assert self.card.hub is not None
        # the first stage runs a vision model's tower: its mmproj file comes too, whole
        mmproj = mmproj_file(self.card.hub.files) if self.start_layer == 0 else None
        extra = mmproj.size if mmproj is not None else 0

        def total(n: int) -> None:
            self.total_bytes = n + extra

        fetch = GGUFShardFetch(self.card, self.start_layer, self.end_layer, self.settings,
                               self._count, self.cancelled, total)
        try:
            shard = fetch.run()
        except (RangeIgnored, DownloadCancelled):
            raise
        except Exception as e:
            raise explain(e, self.card.model_id, self.settings) from e
        if mmproj is not None:
            fetched = download_files(self.card, [mmproj], self.settings, self._count,
                                     self.cancelled)  # fmt: skip
            place_mmproj(self.card.hub, shard, fetched / mmproj.path)
        return shard

    async def run(self, report: Report) -> DownloadProgress:
        """Download, reporting progress; the final state (Completed or Failed) is
        returned, not reported."""
        result: list[Path | BaseException] = []

        async def fetch(scope: anyio.CancelScope) -> None:
            try:
                result.append(await anyio.to_thread.run_sync(self._fetch, abandon_on_cancel=True))
            except Exception as e:
                result.append(e)
            scope.cancel()

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(fetch, tg.cancel_scope)
                await self._report_progress(report)
        finally:
            self.cancelled.set()  # stops the thread at its next chunk if we were cancelled
        outcome = result[0] if result else DownloadCancelled()
        match outcome:
            case Path():
                return DownloadCompleted(
                    path=str(outcome), start_layer=self.start_layer, end_layer=self.end_layer
                )
            case DownloadError():
                logger.warning(f"download of {self.card.model_id} failed: {outcome.message}")
                return DownloadFailed(error_message=outcome.message, status=outcome.status)
            case DownloadCancelled():
                return DownloadFailed(error_message=f"download of {self.card.model_id} cancelled")
            case _:
                logger.opt(exception=outcome).error(f"download of {self.card.model_id} crashed")
                return DownloadFailed(error_message=f"{self.card.model_id}: {outcome!r}")

    async def _report_progress(self, report: Report) -> None:
        last_bytes, last_t = 0, time.monotonic()
        speed = 0.0
        while True:
            await anyio.sleep(self.interval_s)
            now, done = time.monotonic(), self.done_bytes
            if self.total_bytes == 0:
                continue
            instant = (done - last_bytes) / max(now - last_t, 1e-6)
            speed = instant if speed == 0 else 0.7 * speed + 0.3 * instant
            remaining = max(self.total_bytes - done, 0)
            if done != last_bytes:
                await report(
                    DownloadOngoing(
                        downloaded_bytes=min(done, self.total_bytes),
                        total_bytes=self.total_bytes,
                        bytes_per_s=speed,
                        eta_s=remaining / speed if speed > 0 else None,
                        start_layer=self.start_layer,
                        end_layer=self.end_layer,
                    )
                )
            last_bytes, last_t = done, now
