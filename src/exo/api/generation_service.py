"""The one way every API format runs a generation.

Resolve the model, make sure an instance of it serves (placing one if there is none),
wait for a free slot, send the ``GenerateText`` command and read its chunks. Leaving
``GenerationService.generate`` always stops listening, and cancels the command when the
runner has not finished it (the client went away, or the answer ended early).
"""

import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace

import anyio
from anyio import ClosedResourceError, EndOfStream
from loguru import logger

from exo.api.errors import ApiError
from exo.api.generation_events import (
    ChunkTranslator,
    Failed,
    Finished,
    GenerationEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallEvent,
)
from exo.api.handle import NodeHandle
from exo.api.serving import ensure_serving, send
from exo.api.settings import ApiSettings
from exo.api.tool_formats import output_parser
from exo.shared.constants import EXO_MAX_CONTEXT_TOKENS
from exo.shared.models.model_cards import ModelCard, ModelId
from exo.shared.models.registry import CardUnavailable, ModelRegistry
from exo.shared.types.chunks import Chunk, TokenChunk, TokenLogprob
from exo.shared.types.commands import CancelCommand, Command, GenerateText
from exo.shared.types.common import CommandId
from exo.shared.types.state_queries import task_of_command
from exo.shared.types.text_generation import TextGenerationTaskParams
from exo.utils import metrics
from exo.utils.channels import Receiver

Clock = Callable[[], int]

# How long cleanup may take to tell the master a command is cancelled.
_CANCEL_SEND_TIMEOUT_S = 5.0


def served_card(card: ModelCard) -> ModelCard:
    """The card as this cluster serves it: its context is what a runner holds."""
    if card.context_length <= EXO_MAX_CONTEXT_TOKENS:
        return card
    return card.model_copy(update={"context_length": EXO_MAX_CONTEXT_TOKENS})


def failure_error(failed: Failed) -> ApiError:
    """The HTTP error for a generation that failed before its answer began."""
    match failed.code:
        case "context_length_exceeded":
            return ApiError(400, failed.message, param="messages", code=failed.code)
        case "invalid_request":
            return ApiError(400, failed.message, code=failed.code)
        case "insufficient_storage":
            return ApiError(507, failed.message, code=failed.code)
        case None:
            return ApiError(502, f"generation failed: {failed.message}", code="generation_failed")


class AnswerStream:
    """One running generation: its command id and the events of its answer."""

    def __init__(
        self,
        command_id: CommandId,
        model_id: ModelId,
        receiver: Receiver[Chunk],
        stops: Sequence[str],
        accepted_ns: int,
        clock: Clock,
        parse_tools: bool = False,
        template: str | None = None,
    ) -> None:
        self.command_id = command_id
        self.model_id = model_id
        self._receiver = receiver
        self._clock = clock
        self._translator = ChunkTranslator(stops, accepted_ns, clock())
        self._last_token_ns: int | None = None
        # Reasoning, text and calls, in the format of the model's template.
        self._output = output_parser(template, parse_tools)
        # Log-probabilities of every token so far; the first ``_logprobs_sent`` went out.
        self._logprobs: list[TokenLogprob] = []
        self._logprobs_sent = 0

    @property
    def command_done(self) -> bool:
        return self._translator.command_done

    @property
    def prompt_tokens(self) -> int | None:
        """The prompt's length in tokens, once the runner said it."""
        return self._translator.prompt_tokens

    async def events(self) -> AsyncIterator[GenerationEvent]:
        """Text deltas, then one Finished or Failed."""
        while not self._translator.done:
            try:
                chunk = await self._receiver.receive()
            except (EndOfStream, ClosedResourceError):
                for event in self._translator.end_of_stream():
                    yield event
                return
            now = self._clock()
            self._observe(chunk, now)
            if isinstance(chunk, TokenChunk) and chunk.logprobs:
                self._logprobs.extend(chunk.logprobs)
            for event in self._translator.feed(chunk, now):
                for out in map(self._with_logprobs, self._parse(event)):
                    if isinstance(out, Finished):
                        metrics.TOKENS_GENERATED.labels(model=self.model_id).inc(
                            out.usage.completion_tokens
                        )
                    yield out

    def _with_logprobs(self, event: GenerationEvent) -> GenerationEvent:
        """Text carries the log-probabilities that came since the last text; the end, all."""
        match event:
            case TextDelta() if len(self._logprobs) > self._logprobs_sent:
                fresh = tuple(self._logprobs[self._logprobs_sent :])
                self._logprobs_sent = len(self._logprobs)
                return replace(event, logprobs=fresh)
            case Finished() if self._logprobs:
                return replace(event, logprobs=tuple(self._logprobs))
            case _:
                return event

    def _parse(self, event: GenerationEvent) -> list[GenerationEvent]:
        """Reasoning apart from the answer, and function calls out of it (when the request
        offered tools)."""
        output = self._output
        match event:
            case TextDelta():
                return [*output.feed(event.text, self._translator.tokens)]
            case Finished():
                rest: list[GenerationEvent] = [*output.finish(self._translator.tokens)]
                reasoning = "".join(output.reasoning)
                calls = tuple(output.calls)
                reason = event.reason
                if calls and reason in ("stop", "stop_sequence"):
                    reason = "tool_calls"
                thought = output.reasoning_tokens if reasoning else 0
                done = replace(event, reason=reason, tool_calls=calls, reasoning=reasoning,
                               reasoning_tokens=thought)
                return [*rest, done]
            case ReasoningDelta() | ToolCallEvent() | Failed():
                return [event]

    def _observe(self, chunk: Chunk, now_ns: int) -> None:
        if not isinstance(chunk, TokenChunk):
            return
        if self._last_token_ns is None:
            sent = self._translator.sent_ns
            metrics.TIME_TO_FIRST_TOKEN.labels(model=self.model_id).observe((now_ns - sent) / 1e9)
        else:
            gap = (now_ns - self._last_token_ns) / 1e9
            metrics.INTER_TOKEN_LATENCY.labels(model=self.model_id).observe(gap)
        self._last_token_ns = now_ns


class GenerationService:
    """What the API formats share: models, instances, slots and commands."""

    def __init__(
        self,
        handle: NodeHandle,
        settings: ApiSettings,
        registry: ModelRegistry,
        clock: Clock = time.monotonic_ns,
    ) -> None:
        self.handle = handle
        self.registry = registry
        self._placement_timeout_s = settings.placement_timeout_s
        self.keep_alive_interval_s = settings.keep_alive_interval_s
        self.settings = settings
        self._max_queued = settings.max_queued_requests
        self._slots = anyio.Semaphore(settings.max_concurrent_requests)
        self._waiting = 0
        self._placement_locks: dict[ModelId, anyio.Lock] = {}
        self._active: dict[CommandId, AnswerStream] = {}
        self._clock = clock

    # ------------------------------------------------------------ models

    def model_cards(self) -> list[ModelCard]:
        return [served_card(card) for card in self.registry.cards()]

    async def resolve_model_async(self, name: str) -> ModelCard:
        """A known card (or one an instance in the state carries), or one built from the
        hub for an ``org/repo[:QUANT]`` name or a catalogue alias."""
        try:
            return self.resolve_model(name)
        except ApiError:
            if self.registry.hub_name(name) is None:
                if (problem := self.registry.name_problem(name)) is not None:  # no retry helps
                    raise ApiError(400, problem, param="model", code="invalid_model_name",
                                   headers={"x-should-retry": "false"}) from None
                raise
        return await self.fetch_card(name)

    async def fetch_card(self, name: str) -> ModelCard:
        """A hub model's card, built by the node's registry (which keeps it)."""
        try:
            return await anyio.to_thread.run_sync(self.registry.fetch, name)
        except CardUnavailable as e:
            if e.status is None:
                raise ApiError(503, e.message, code="hub_unavailable",
                               headers={"Retry-After": "10"}) from e
            code = "model_access_denied" if e.status == 403 else "model_not_found"
            raise ApiError(e.status, e.message, param="model", code=code,
                           headers={"x-should-retry": "false"}) from e

    def resolve_model(self, name: str) -> ModelCard:
        card = self.registry.resolve(name, self.handle.state())
        if card is None:
            known = ", ".join(sorted(c.model_id for c in self.registry.cards())) or "none"
            raise ApiError(
                404,
                f"model '{name}' not found; known models: {known}",
                param="model",
                code="model_not_found",
            )
        return served_card(card)

    # ------------------------------------------------------------ generation

    @asynccontextmanager
    async def generate(
        self,
        params: TextGenerationTaskParams,
        card: ModelCard,
        command_id: CommandId | None = None,
    ) -> AsyncGenerator[AnswerStream, None]:
        """Run a generation; raises ApiError (before yielding) when it cannot start."""
        accepted = self._clock()
        await self.ensure_serving(card)
        async with self._slot():
            command = GenerateText(
                command_id=command_id or CommandId(),
                task_params=params,
                origin_node_id=self.handle.node_id,
            )
            command_id = command.command_id
            receiver = self.handle.open_response(command_id)
            generation = AnswerStream(
                command.command_id,
                card.model_id,
                receiver,
                params.stop,
                accepted,
                self._clock,
                parse_tools=bool(params.tools) and params.tool_choice != "none",
                template=card.chat_template,
            )
            self._active[command_id] = generation
            sent = False
            try:
                await self.send(command)
                sent = True
                yield generation
            finally:
                del self._active[command_id]
                self.handle.close_response(command_id)
                if sent and not generation.command_done:
                    await self._send_cancel(command_id)

    async def cancel(self, command_id: CommandId) -> bool:
        """Cancel a generation running here or known to the cluster; False if unknown."""
        known = command_id in self._active or (
            task_of_command(self.handle.state(), command_id) is not None
        )
        if known:
            await self.send(CancelCommand(cancelled_command_id=command_id))
        return known

    @asynccontextmanager
    async def _slot(self) -> AsyncGenerator[None, None]:
        if self._slots.value == 0 and self._waiting >= self._max_queued:
            raise ApiError(
                429, f"too many requests: {self._waiting} are already waiting for a slot"
            )
        self._waiting += 1
        metrics.QUEUE_DEPTH.inc()
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
            metrics.QUEUE_DEPTH.dec()
        metrics.ACTIVE_GENERATIONS.inc()
        try:
            yield
        finally:
            metrics.ACTIVE_GENERATIONS.dec()
            self._slots.release()

    async def send(self, command: Command) -> None:
        await send(self.handle, command)

    async def _send_cancel(self, command_id: CommandId) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(_CANCEL_SEND_TIMEOUT_S):
            try:
                await self.handle.send_command(CancelCommand(cancelled_command_id=command_id))
            except Exception as e:
                logger.opt(exception=e).warning(f"could not cancel command {command_id}")

    # ------------------------------------------------------------ instances

    async def ensure_serving(self, card: ModelCard) -> None:
        """Return once an instance of the model serves; place one if there is none."""
        lock = self._placement_locks.setdefault(card.model_id, anyio.Lock())
        await ensure_serving(self.handle, card, self._placement_timeout_s, lock)


async def collect(generation: AnswerStream) -> tuple[str, Finished]:
    """A whole answer: its text and how it ended. A failed generation is a 502."""
    parts: list[str] = []
    async for event in generation.events():
        match event:
            case Failed():
                raise failure_error(event)
            case Finished():
                return "".join(parts), event
            case ToolCallEvent() | ReasoningDelta():
                pass  # in Finished.tool_calls and Finished.reasoning
            case TextDelta():
                parts.append(event.text)
    raise ApiError(502, "generation ended without an answer", code="generation_failed")
