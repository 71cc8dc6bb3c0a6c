"""Commands whose outcome a client waits for, shared by the API and the CLI.

* ``ensure_serving``: place-and-wait. Return once an instance of a model serves, placing
  one if there is none; fail at once (an ``ApiError``) on a placement the master refused,
  a download that failed for good, an instance removed before it served, or the timeout.
* ``submit_and_wait``: send a command and answer only once its effect is in the state, or
  with the master's refusal (the log that cannot take a write is a 507). Answering before
  the command was sequenced told clients "done" for a command that was never applied.
"""

import contextlib
import time
from collections.abc import Callable

import anyio
from loguru import logger

from exo.api.download_wait import DownloadWatch, terminal_error
from exo.api.errors import ApiError
from exo.api.handle import NodeHandle
from exo.master.decide import refusal_status
from exo.shared.models.model_cards import ModelCard
from exo.shared.types.chunks import Chunk, ErrorChunk
from exo.shared.types.commands import Command, PlaceInstance
from exo.shared.types.state import State
from exo.shared.types.state_queries import instances_of, serving_instance
from exo.shared.types.worker.downloads import DownloadFailed
from exo.shared.types.worker.runners import RunnerFailed
from exo.utils.channels import Receiver

OWN_INFO_WAIT_S = 30.0
"""How long a placement waits for this node to have reported its own memory."""


async def send(handle: NodeHandle, command: Command) -> None:
    """Send a command to the master; a 503 when it cannot be sent."""
    try:
        await handle.send_command(command)
    except Exception as e:
        logger.opt(exception=e).warning(f"could not send {command.kind}")
        raise ApiError(503, f"could not send the request to the cluster: {e}") from e


def refusal_error(chunk: ErrorChunk, what: str) -> ApiError:
    """The HTTP error for a command that was not applied: the status of the master's
    refusal (a log that cannot take the write: 507), else 503 (no master reached)."""
    if chunk.refusal is None:
        return ApiError(503, f"{what}: {chunk.error_message}", headers={"Retry-After": "5"})
    code = "insufficient_storage" if chunk.refusal == "log_full" else chunk.refusal
    return ApiError(refusal_status(chunk.refusal), f"{what}: {chunk.error_message}", code=code)


async def submit_and_wait(
    handle: NodeHandle,
    command: Command,
    applied: Callable[[State], bool],
    *,
    timeout_s: float,
    what: str,
) -> None:
    """Send ``command``; return once ``applied`` holds for the state; raise the master's
    refusal as an ``ApiError`` (``refusal_error``), or a 503 after ``timeout_s``."""
    receiver = handle.open_response(command.command_id)
    refused: list[ApiError] = []
    try:
        await send(handle, command)
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                async for chunk in receiver:
                    if isinstance(chunk, ErrorChunk):
                        refused.append(refusal_error(chunk, what))
                        tg.cancel_scope.cancel()
                        return

            tg.start_soon(watch)
            try:
                await handle.wait_for_state(applied, timeout_s)
            except TimeoutError:
                refused.append(ApiError(
                    503, f"{what}: not applied within {timeout_s:g} s (it may still be: "
                    "see GET /state)", headers={"Retry-After": "5"}))
            tg.cancel_scope.cancel()
    finally:
        handle.close_response(command.command_id)
    if refused:
        raise refused[0]


async def ensure_serving(
    handle: NodeHandle, card: ModelCard, timeout_s: float, lock: anyio.Lock | None = None
) -> None:
    """Return once an instance of the model serves; place one if there is none. ``lock``:
    held while placing, so that of the requests that need the model, one places and the
    others wait for it."""
    if serving_instance(handle.state(), card.model_id) is not None:
        return
    async with lock or anyio.Lock():
        state = handle.state()
        if serving_instance(state, card.model_id) is not None:
            return
        if instances_of(state, card.model_id):
            await _wait_serving(handle, card, None, timeout_s)
        else:
            await _place_and_wait(handle, card, timeout_s)


async def _place_and_wait(handle: NodeHandle, card: ModelCard, timeout_s: float) -> None:
    # The card goes along: the master may not know the model (a hub card, or a file only
    # the nodes that listed it know of). Another node may be placing it too: one instance.
    command = PlaceInstance(model_id=card.model_id, model_card=card, unless_present=True)
    # A node that just started has not reported its own memory yet: placing now would
    # find no node at all. Its first report comes within seconds.
    with contextlib.suppress(TimeoutError):
        await handle.wait_for_state(lambda state: handle.node_id in state.nodes, OWN_INFO_WAIT_S)
    receiver = handle.open_response(command.command_id)
    try:
        await send(handle, command)
        await _wait_serving(handle, card, receiver, timeout_s)
    finally:
        handle.close_response(command.command_id)


async def _wait_serving(
    handle: NodeHandle, card: ModelCard, placement: Receiver[Chunk] | None, timeout_s: float
) -> None:
    """Wait for a serving instance; fail on a placement error, a timeout, or when the
    instance goes away before it serves."""
    model_id = card.model_id
    seen = [bool(instances_of(handle.state(), model_id))]
    failure: list[ApiError] = []
    downloads = DownloadWatch(model_id)
    runner_error: list[str] = []

    def settled(state: State) -> bool:
        if serving_instance(state, model_id) is not None:
            return True
        for instance in instances_of(state, model_id):
            for rid in instance.shard_assignments.runner_to_shard:
                status = state.runners.get(rid)
                if isinstance(status, RunnerFailed):
                    runner_error[:] = [status.error_message]
        error = downloads.observe(state, time.monotonic())
        if error is not None:
            failure.append(error)
            return True
        if instances_of(state, model_id):
            seen[0] = True
            return False
        return seen[0]

    async def watch_placement(receiver: Receiver[Chunk], scope: anyio.CancelScope) -> None:
        async for chunk in receiver:
            if isinstance(chunk, ErrorChunk):
                if chunk.refusal == "log_full":
                    failure.append(refusal_error(chunk, f"placing {model_id} failed"))
                else:  # the model cannot be served here: a client may retry later
                    failure.append(ApiError(
                        503, f"placing {model_id} failed: {chunk.error_message}",
                        code="model_unavailable",
                    ))
                scope.cancel()
                return

    timeout = timeout_s
    deadline = time.monotonic() + timeout
    async with anyio.create_task_group() as tg:
        if placement is not None:
            tg.start_soon(watch_placement, placement, tg.cancel_scope)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                failure.append(ApiError(
                    503, f"no instance of {model_id} became ready within {timeout:g} s",
                    code="model_unavailable",
                ))
                break
            try:  # wake up at least every second: a transient failure times out
                await handle.wait_for_state(settled, min(left, 1.0))
                break
            except TimeoutError:
                continue
        tg.cancel_scope.cancel()
    if failure:
        raise failure[0]
    state = handle.state()
    if serving_instance(state, model_id) is None:
        # The instance may have come and gone between two looks (several events applied at
        # once): a download that failed for good on any node is still the real cause.
        for progress in (d.get(model_id) for d in state.downloads.values()):
            if isinstance(progress, DownloadFailed) and progress.terminal:
                raise terminal_error(model_id, progress)
        cause = f": the last runner error was: {runner_error[0]}" if runner_error else ""
        raise ApiError(
            503,
            f"the instance of {model_id} was removed before it became ready{cause}",
            code="model_unavailable",
        )
