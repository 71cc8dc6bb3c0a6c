"""Per-node download progress of model files."""

from typing import Annotated, Literal

from pydantic import Field

from exo.shared.types.common import FrozenModel
from exo.shared.types.worker.shards import ShardMetadata, layer_range


class DownloadPending(FrozenModel):
    kind: Literal["DownloadPending"] = "DownloadPending"


class DownloadOngoing(FrozenModel):
    kind: Literal["DownloadOngoing"] = "DownloadOngoing"
    downloaded_bytes: int
    total_bytes: int
    bytes_per_s: float = 0.0
    eta_s: float | None = None
    start_layer: int | None = None
    end_layer: int | None = None
    """The layers ``[start_layer, end_layer)`` being fetched (None: the whole model, or not
    said); a GGUF shard's download fetches only those layers' tensors."""


class DownloadCompleted(FrozenModel):
    kind: Literal["DownloadCompleted"] = "DownloadCompleted"
    path: str
    start_layer: int | None = None
    end_layer: int | None = None
    """The layers ``[start_layer, end_layer)`` whose files this node holds; None for a
    model held whole (a local file or folder). A node that fetched one pipeline shard
    holds only that shard's weight files."""

    def covers(self, start_layer: int, end_layer: int) -> bool:
        if self.start_layer is None or self.end_layer is None:
            return True
        return self.start_layer <= start_layer and end_layer <= self.end_layer


class DownloadFailed(FrozenModel):
    kind: Literal["DownloadFailed"] = "DownloadFailed"
    error_message: str
    status: int | None = None
    """For a failure that retrying cannot fix, the HTTP status that says why (404 not
    on the hub, 403 gated or forbidden, 507 no disk space); None for a transient one."""

    @property
    def terminal(self) -> bool:
        return self.status is not None


DownloadProgress = Annotated[
    DownloadPending | DownloadOngoing | DownloadCompleted | DownloadFailed,
    Field(discriminator="kind"),
]


def holds_shard(progress: DownloadProgress | None, shard: ShardMetadata) -> bool:
    """This node has the files of ``shard`` (not merely some shard of its model)."""
    return isinstance(progress, DownloadCompleted) and progress.covers(*layer_range(shard))
