"""What a request waiting for a model learns from the downloads in the state.

A download that failed for good (not on the hub, gated, no disk) fails every waiting
request at once with the status that says why, marked so that clients do not retry it
(the OpenAI SDKs honour ``x-should-retry: false``; they would retry a 5xx otherwise). A
download that keeps failing transiently fails a request after ``transient_limit_s`` of
its wait with a 503 and ``Retry-After``.
"""

from dataclasses import dataclass, field

from exo.api.errors import ApiError
from exo.shared.models.model_cards import ModelId
from exo.shared.types.common import NodeId
from exo.shared.types.state import State
from exo.shared.types.state_queries import instances_of
from exo.shared.types.worker.downloads import DownloadFailed, DownloadOngoing

TRANSIENT_LIMIT_S = 30.0
_NO_RETRY = {"x-should-retry": "false"}


@dataclass
class DownloadWatch:
    model_id: ModelId
    transient_limit_s: float = TRANSIENT_LIMIT_S
    nodes: set[NodeId] = field(default_factory=set[NodeId])
    _transient_since: float | None = None
    _bytes_seen: int = 0

    def observe(self, state: State, now: float) -> ApiError | None:
        """The error to answer with, if the model's downloads say the wait is hopeless."""
        for instance in instances_of(state, self.model_id):
            self.nodes |= set(instance.shard_assignments.node_to_runner)
        transient: DownloadFailed | None = None
        downloaded = 0
        for node_id in self.nodes:
            progress = state.downloads.get(node_id, {}).get(self.model_id)
            if isinstance(progress, DownloadFailed):
                if progress.terminal:
                    return terminal_error(self.model_id, progress)
                transient = progress
            elif isinstance(progress, DownloadOngoing):
                downloaded += progress.downloaded_bytes
        if downloaded > self._bytes_seen:  # bytes are flowing again: the clock restarts
            self._bytes_seen = downloaded
            self._transient_since = None
        if transient is None:
            return None
        # A retry that starts and fails again without a byte does not restart the clock.
        if self._transient_since is None:
            self._transient_since = now
        if now - self._transient_since >= self.transient_limit_s:
            return ApiError(
                503,
                f"{self.model_id} cannot be downloaded right now: {transient.error_message}",
                code="model_download_unavailable",
                headers={"Retry-After": "30"},
            )
        return None


def terminal_error(model_id: ModelId, failure: DownloadFailed) -> ApiError:
    status = failure.status or 404
    code = {
        403: "model_access_denied", 422: "model_file_invalid", 507: "insufficient_storage"
    }.get(status, "model_not_found")
    return ApiError(
        status,
        f"model {model_id} cannot be obtained: {failure.error_message}",
        param="model",
        code=code,
        headers=_NO_RETRY,
    )
