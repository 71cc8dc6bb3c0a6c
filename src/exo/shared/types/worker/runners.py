"""Runner ids and the statuses a runner moves through."""

from typing import Annotated, Literal

from pydantic import Field

from exo.shared.types.common import FrozenModel, Id


class RunnerId(Id):
    __slots__ = ()


class RunnerIdle(FrozenModel):
    kind: Literal["RunnerIdle"] = "RunnerIdle"


class RunnerConnecting(FrozenModel):
    kind: Literal["RunnerConnecting"] = "RunnerConnecting"


class RunnerConnected(FrozenModel):
    kind: Literal["RunnerConnected"] = "RunnerConnected"


class RunnerLoading(FrozenModel):
    kind: Literal["RunnerLoading"] = "RunnerLoading"
    layers_loaded: int = 0
    total_layers: int = 0


class RunnerLoaded(FrozenModel):
    kind: Literal["RunnerLoaded"] = "RunnerLoaded"


class RunnerWarmingUp(FrozenModel):
    kind: Literal["RunnerWarmingUp"] = "RunnerWarmingUp"


class RunnerReady(FrozenModel):
    kind: Literal["RunnerReady"] = "RunnerReady"


class RunnerRunning(FrozenModel):
    kind: Literal["RunnerRunning"] = "RunnerRunning"
    active_requests: int = 1


class RunnerShuttingDown(FrozenModel):
    kind: Literal["RunnerShuttingDown"] = "RunnerShuttingDown"


class RunnerShutdown(FrozenModel):
    kind: Literal["RunnerShutdown"] = "RunnerShutdown"


class RunnerFailed(FrozenModel):
    kind: Literal["RunnerFailed"] = "RunnerFailed"
    error_message: str
    deterministic: bool = False
    """The load failed in a way a retry would repeat (a model file it cannot use): the
    instance is given up at once instead of after the retries with backoff."""


RunnerStatus = Annotated[
    RunnerIdle
    | RunnerConnecting
    | RunnerConnected
    | RunnerLoading
    | RunnerLoaded
    | RunnerWarmingUp
    | RunnerReady
    | RunnerRunning
    | RunnerShuttingDown
    | RunnerShutdown
    | RunnerFailed,
    Field(discriminator="kind"),
]

# Statuses in which a runner can take generation requests.
SERVING_STATUSES = (RunnerReady, RunnerRunning)
