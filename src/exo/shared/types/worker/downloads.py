"""Per-node download progress of model files."""

from typing import Annotated, Literal

from pydantic import Field

from exo.shared.types.common import FrozenModel


class DownloadPending(FrozenModel):
    kind: Literal["DownloadPending"] = "DownloadPending"


class DownloadOngoing(FrozenModel):
    kind: Literal["DownloadOngoing"] = "DownloadOngoing"
    downloaded_bytes: int
    total_bytes: int
    bytes_per_s: float = 0.0
    eta_s: float | None = None


class DownloadCompleted(FrozenModel):
    kind: Literal["DownloadCompleted"] = "DownloadCompleted"
    path: str


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
