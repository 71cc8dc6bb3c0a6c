"""A scripted, in-process ``NodeHandle`` for API tests, and a real uvicorn server for it.

``ScriptedNode`` plays master and worker: it applies commands to its State the way the
master would (placement through the real ``place_instance``; the instance's runner
becomes ready after ``serve_after_s``), and answers ``GenerateText`` with deterministic
``TokenChunk``s following its ``Script``: a fixed token list, optionally slow, endless
(until cancelled) or failing after some tokens with an ``ErrorChunk``.
"""

import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import uvicorn
from anyio.abc import TaskGroup

from exo.master.placement import PlacementError, place_instance
from exo.shared.models.embedded import embedded_model_card
from exo.shared.models.model_cards import ModelCard, ModelId
from exo.shared.tests.builders import model_card
from exo.shared.types.chunks import Chunk, ErrorChunk, FinishReason, TokenChunk, Usage
from exo.shared.types.commands import (
    CancelCommand,
    Command,
    CreateInstance,
    DeleteInstance,
    DownloadAction,
    GenerateText,
    PlaceInstance,
    RecordRefusal,
)
from exo.shared.types.common import CommandId, NodeId
from exo.shared.types.memory import Memory
from exo.shared.types.profiling import NodeInfo
from exo.shared.types.state import State
from exo.shared.types.worker.instances import InstanceId
from exo.shared.types.worker.runners import RunnerLoading, RunnerReady
from exo.utils.channels import Receiver, Sender, channel

NODE_ID = NodeId("node-test")
TOKENS = ("Hello", ",", " world", "!", " I", " am", " exo", ".")
TEXT = "".join(TOKENS)
PROMPT_TOKENS = 11


def small_card(model_id: str, aliases: Sequence[str] = ()) -> ModelCard:
    card = model_card(ModelId(model_id), n_layers=4)
    return card.model_copy(update={"aliases": list(aliases)})


def huge_card() -> ModelCard:
    """A model no test node has the memory for."""
    card = small_card("test-org/huge-model")
    return card.model_copy(update={"storage_size": Memory.from_mb(1024 * 1024)})


def default_cards() -> list[ModelCard]:
    return [embedded_model_card(), small_card("test-org/model-1", ["m1"]), huge_card()]


@dataclass
class Script:
    tokens: Sequence[str] = TOKENS
    token_delay_s: float = 0.0
    # Keep generating (cycling through the tokens) until cancelled.
    endless: bool = False
    # Send an ErrorChunk after this many tokens.
    fail_after: int | None = None
    prompt_tokens: int = PROMPT_TOKENS
    # The runner's context: a prompt this long or longer is refused with a typed error.
    context_length: int = 2048
    # The answer when the request offers tools and the last message is not a tool result.
    tool_tokens: Sequence[str] | None = None


@dataclass
class _Running:
    command: GenerateText
    cancelled: anyio.Event = field(default_factory=anyio.Event)


class ScriptedNode:
    def __init__(
        self,
        cards: Sequence[ModelCard] | None = None,
        script: Script | None = None,
        serve_after_s: float = 0.0,
        memory_mb: float = 8192,
    ) -> None:
        self.script = script or Script()
        self.serve_after_s = serve_after_s
        # Instances are placed but their runners never become ready.
        self.never_serve = False
        self._cards = list(cards if cards is not None else default_cards())
        info = NodeInfo(
            hostname="test-host",
            cpu_count=4,
            memory_total=Memory.from_mb(memory_mb),
            memory_available=Memory.from_mb(memory_mb),
        )
        self._state = State(nodes={NODE_ID: info})
        self._changed = anyio.Event()
        self._responses: dict[CommandId, Sender[Chunk]] = {}
        self._running: dict[CommandId, _Running] = {}
        self._task_group: TaskGroup | None = None
        self._commands: list[Command] = []
        self._commands_changed = threading.Condition()
        self.generations: list[GenerateText] = []

    # ------------------------------------------------------------ NodeHandle

    @property
    def node_id(self) -> NodeId:
        return NODE_ID

    def state(self) -> State:
        return self._state

    def master_id(self) -> NodeId | None:
        return NODE_ID

    async def wait_for_state(self, predicate: Callable[[State], bool], timeout: float) -> State:
        with anyio.fail_after(timeout):
            while True:
                state = self._state
                if predicate(state):
                    return state
                await self._changed.wait()

    async def send_command(self, command: Command) -> None:
        with self._commands_changed:
            self._commands.append(command)
            self._commands_changed.notify_all()
        match command:
            case PlaceInstance():
                self._place(command)
            case GenerateText():
                self.generations.append(command)
                running = _Running(command)
                self._running[command.command_id] = running
                self._spawn(self._generate, running)
            case CancelCommand():
                target = self._running.get(command.cancelled_command_id)
                if target is not None:
                    target.cancelled.set()
            case DeleteInstance():
                self._delete(command.instance_id)
            case CreateInstance() | DownloadAction() | RecordRefusal():
                pass

    def open_response(self, command_id: CommandId) -> Receiver[Chunk]:
        sender, receiver = channel[Chunk]()
        self._responses[command_id] = sender
        return receiver

    def close_response(self, command_id: CommandId) -> None:
        sender = self._responses.pop(command_id, None)
        if sender is not None:
            sender.close()

    def model_cards(self) -> list[ModelCard]:
        return list(self._cards)

    # ------------------------------------------------------------ for tests

    def commands(self) -> list[Command]:
        with self._commands_changed:
            return list(self._commands)

    def wait_for_command(self, match: Callable[[Command], bool], timeout: float = 5.0) -> Command:
        """Block the calling (test) thread until a matching command was sent."""
        deadline = time.monotonic() + timeout
        with self._commands_changed:
            while True:
                for command in self._commands:
                    if match(command):
                        return command
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no matching command within {timeout} s")
                self._commands_changed.wait(left)

    def open_responses(self) -> int:
        return len(self._responses)

    def set_state(self, state: State) -> None:
        self._state = state
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    # ------------------------------------------------------------ the scripted cluster

    def _spawn(self, fn: Callable[..., Any], *args: Any) -> None:
        assert self._task_group is not None, "serve the node with serve_node()"
        self._task_group.start_soon(fn, *args)

    def _deliver(self, command_id: CommandId, chunk: Chunk) -> None:
        sender = self._responses.get(command_id)
        if sender is None:
            return
        sender.send_nowait(chunk)
        if chunk.finish_reason is not None:
            self._responses.pop(command_id, None)
            sender.close()

    def _place(self, command: PlaceInstance) -> None:
        card = next(c for c in self._cards if c.model_id == command.model_id)
        state = self._state
        placed = place_instance(
            card,
            command.sharding,
            command.min_nodes,
            state.nodes,
            state.topology,
            state.instances,
            InstanceId(),
        )
        if isinstance(placed, PlacementError):
            self._deliver(
                command.command_id, ErrorChunk(model=card.model_id, error_message=placed.reason)
            )
            return
        runners = dict.fromkeys(placed.shard_assignments.runner_to_shard, RunnerLoading())
        self.set_state(
            state.model_copy(
                update={
                    "instances": {**state.instances, placed.instance_id: placed},
                    "runners": {**state.runners, **runners},
                }
            )
        )
        if not self.never_serve:
            self._spawn(self._become_ready, placed.instance_id)

    async def _become_ready(self, instance_id: InstanceId) -> None:
        await anyio.sleep(self.serve_after_s)
        state = self._state
        instance = state.instances.get(instance_id)
        if instance is None:
            return
        ready = dict.fromkeys(instance.shard_assignments.runner_to_shard, RunnerReady())
        self.set_state(state.model_copy(update={"runners": {**state.runners, **ready}}))

    def _delete(self, instance_id: InstanceId) -> None:
        state = self._state
        instance = state.instances.get(instance_id)
        if instance is None:
            return
        gone = set(instance.shard_assignments.runner_to_shard)
        self.set_state(
            state.model_copy(
                update={
                    "instances": {k: v for k, v in state.instances.items() if k != instance_id},
                    "runners": {k: v for k, v in state.runners.items() if k not in gone},
                }
            )
        )

    async def _generate(self, running: _Running) -> None:
        command = running.command
        script = self.script
        params = command.task_params
        command_id = command.command_id
        try:
            if params.count_only:
                self._deliver(command_id, self._token(params.model, "", -1, "stop", 0))
                return
            if params.embed:  # a fixed unit vector stands in for the model's
                chunk = self._token(params.model, "", -1, "stop", 0)
                self._deliver(command_id, chunk.model_copy(update={"embedding": [0.6, 0.8]}))
                return
            if script.prompt_tokens >= min(script.context_length, params.num_ctx or 1 << 30):
                error = ErrorChunk(
                    model=params.model,
                    error_message=f"prompt is {script.prompt_tokens} tokens",
                    error_code="context_length_exceeded",
                )
                self._deliver(command_id, error)
                return
            tokens = script.tokens
            if script.tool_tokens is not None and params.tools and params.input[-1].role != "tool":
                tokens = script.tool_tokens
            limit = params.max_tokens
            n = len(tokens)
            total = limit if script.endless else min(n, limit or n)
            # Ending on the limit before the script's natural end is "length".
            cut = limit is not None and (script.endless or limit < n)
            i = 0
            while total is None or i < total:
                if script.token_delay_s > 0:
                    with anyio.move_on_after(script.token_delay_s):
                        await running.cancelled.wait()
                if running.cancelled.is_set():
                    self._deliver(command_id, self._token(params.model, "", i, "cancelled", i))
                    return
                if script.fail_after is not None and i == script.fail_after:
                    error = ErrorChunk(model=params.model, error_message="runner died")
                    self._deliver(command_id, error)
                    return
                reason: FinishReason | None = None
                if total is not None and i == total - 1:
                    reason = "length" if cut else "stop"
                chunk = self._token(params.model, tokens[i % n], i, reason, i + 1)
                self._deliver(command_id, chunk)
                i += 1
                await anyio.sleep(0)
        finally:
            self._running.pop(command_id, None)

    def _token(
        self, model: ModelId, text: str, idx: int, reason: FinishReason | None, completion: int
    ) -> TokenChunk:
        usage = None
        if reason is not None:
            usage = Usage(prompt_tokens=self.script.prompt_tokens, completion_tokens=completion)
        return TokenChunk(
            model=model,
            text=text,
            token_id=idx,
            idx=max(idx, 0),
            finish_reason=reason,
            usage=usage,
            prompt_tokens=self.script.prompt_tokens if idx <= 0 else None,
        )


class ServedApp:
    """A real uvicorn server on 127.0.0.1 (a free port), in a thread, with the node's
    task group running on the server's event loop."""

    def __init__(self, app: Any, node: ScriptedNode) -> None:
        self._node = node
        # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets that say so,
        # and without it every keep-alive response waits ~40 ms for a delayed ACK.
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.bind(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app, log_level="warning", lifespan="off", timeout_graceful_shutdown=1
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            anyio.run(self._serve)
        except BaseException as e:  # reported by stop()
            self._error = e

    async def _serve(self) -> None:
        async with anyio.create_task_group() as tg:
            self._node._task_group = tg
            await self._server.serve(sockets=[self._sock])
            tg.cancel_scope.cancel()

    def start(self, timeout: float = 10.0) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start: {self._error!r}")
            time.sleep(0.005)

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)
        self._sock.close()
        if self._thread.is_alive():
            raise RuntimeError("server did not stop")
