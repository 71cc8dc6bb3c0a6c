"""Pipelined stages: rank 0 keeps one micro-batch in flight per stage.

A pipeline of k stages that runs one step at a time leaves k-1 stages idle. Here rank 0's
requests are split into k *lanes* (micro-batches; ``EXO_PIPELINE_LANES`` sets another
count), each its own continuous batcher over its
own range of cache slots (lane m holds slots ``offset_m .. offset_m + size_m - 1`` on every
stage). A pipeline has k times a runner's ``max_batch`` slots (``pipeline_slots``), so each
lane is a whole batch: a stage streams its weights once per ``max_batch`` rows, as one runner
does. Its caches are sized, as one runner's, for ``max_batch`` requests of the whole context:
the lanes share that many pages (``PageBudget``), and a request whose pages do not fit waits.

A lane's step runs as usual until it calls the model; the forward computes stage 0,
sends the activations on and *parks* the lane; rank 0 then steps another lane while the
first one's activations travel through the later stages. When a lane's logits come back its
step resumes: it samples, and its next forward goes in at the tail of the pipeline. The
stages take the micro-batches in the order they were sent, so stage i works on one lane
while stage i+1 works on another.

Each lane's step runs in a thread of its own, but only one thread runs at a time: control
passes back and forth explicitly (a lane runs until it parks or finishes its step, then the
scheduler runs), so the batchers see exactly the sequential world they were written for and
nothing is shared between threads at once. A request's tokens do not depend on its lane:
every kernel computes a row independently of the others in its batch.

A cancel for a lane in the middle of a step first finishes that step (its slot moves and
releases, mirrored on every stage, must not cut into a step in flight): at most one trip
through the pipeline. The step's outputs for the lane's other requests are kept for the
next ``step``; the cancelled request's slot is free on every stage when ``cancel`` returns.
"""

import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, cast

import torch
from torch import Tensor

from exo.worker.engines.batch import BatchGenerator, StepOutput, pages_needed
from exo.worker.engines.config import LlamaConfig
from exo.worker.engines.images import ImageSpans
from exo.worker.engines.kv_cache import KVCache
from exo.worker.engines.models.base import StepInputs
from exo.worker.engines.sampling import SamplingParams


class Pending(Protocol):
    """Logits on their way back from the last stage."""

    def wait(self) -> Tensor: ...


class PipelineHead(Protocol):
    """Rank 0 of a pipeline, as the scheduler drives it."""

    @property
    def config(self) -> LlamaConfig: ...

    @property
    def device(self) -> torch.device: ...

    def new_local_cache(self, max_batch: int, max_seq: int) -> KVCache: ...

    def launch(self, tokens: Tensor, local: StepInputs, routed: StepInputs, cache: KVCache,
               every_position: bool, lane: int) -> Pending:
        """Run stage 0 on ``tokens`` (``local``: the lane's own slots in ``cache``), send the
        activations on (``routed``: the same rows at their slots on the other stages)."""
        ...

    def mirror_move(self, src: int, dst: int, length: int) -> None: ...

    def mirror_release(self, slot: int) -> None: ...


BatcherFactory = Callable[["LaneModel", int], BatchGenerator]


class _Baton:
    """Strict alternation between the scheduler and one lane thread."""

    def __init__(self) -> None:
        self.to_lane = threading.Semaphore(0)
        self.to_scheduler = threading.Semaphore(0)

    def hand_to_lane(self) -> None:
        self.to_lane.release()
        self.to_scheduler.acquire()

    def hand_back(self) -> None:
        self.to_scheduler.release()
        self.to_lane.acquire()


class LaneCache:
    """A lane's cache on rank 0; moves and releases are mirrored (at the lane's offset) on
    every other stage first."""

    def __init__(self, local: KVCache, head: PipelineHead, offset: int) -> None:
        self.local, self.head, self.offset = local, head, offset

    def move_slot(self, src: int, dst: int, length: int) -> None:
        self.head.mirror_move(src + self.offset, dst + self.offset, length)
        self.local.move_slot(src, dst, length)

    def release(self, slot: int) -> None:
        self.head.mirror_release(slot + self.offset)
        self.local.release(slot)

    def held(self) -> int:
        return sum(1 for pages in self.local.table if pages)


class LaneModel:
    """What a lane's batcher sees: the whole model, whose forward parks the lane until its
    logits are back."""

    def __init__(self, head: PipelineHead, lane: "Lane") -> None:
        self.head, self.lane = head, lane

    @property
    def config(self) -> LlamaConfig:
        return self.head.config

    @property
    def device(self) -> torch.device:
        return self.head.device

    def new_cache(self, max_batch: int, max_seq: int) -> KVCache:
        local = self.head.new_local_cache(max_batch, max_seq)
        cache = LaneCache(local, self.head, self.lane.offset)
        self.lane.cache = cache
        return cast(KVCache, cache)  # the batcher's moves and releases go through it

    def forward(self, tokens: Tensor, step: StepInputs, cache: KVCache,
                every_position: bool = False) -> Tensor:
        lane_cache = cast(LaneCache, cache)
        routed = replace(step, slots=tuple(s + self.lane.offset for s in step.slots))
        pending = self.head.launch(tokens, step, routed, lane_cache.local, every_position,
                                   self.lane.index)  # fmt: skip
        return self.lane.park(pending)


class Lane:
    """One micro-batch: a batcher over a range of slots, stepped in its own thread."""

    def __init__(self, index: int, offset: int, size: int, head: PipelineHead,
                 make: BatcherFactory) -> None:
        self.index, self.offset, self.size = index, offset, size
        self.cache: LaneCache | None = None
        self.batcher = make(LaneModel(head, self), size)
        self.in_step = False
        self.pending: Pending | None = None
        self._reply: Tensor | BaseException | None = None
        self._outputs: list[StepOutput] = []
        self._error: BaseException | None = None
        self._closing = False
        self._baton = _Baton()
        self._thread: threading.Thread | None = None

    # --- scheduler side ----------------------------------------------------------------------

    def start_step(self) -> None:
        """Run a step until it parks on a forward or ends."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"exo-lane-{self.index}",
                                            daemon=True)  # fmt: skip
            self._thread.start()
        self.in_step = True
        self._baton.hand_to_lane()

    def resume(self, reply: Tensor | BaseException) -> None:
        self._reply = reply
        self.pending = None
        self._baton.hand_to_lane()

    def take_outputs(self) -> list[StepOutput]:
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        outputs, self._outputs = self._outputs, []
        return outputs

    def close(self) -> None:
        if self._thread is not None and not self.in_step:
            self._closing = True
            self._baton.hand_to_lane()

    # --- lane side ---------------------------------------------------------------------------

    def park(self, pending: Pending) -> Tensor:
        self.pending = pending
        self._baton.hand_back()
        reply, self._reply = self._reply, None
        if isinstance(reply, BaseException):
            raise reply
        assert reply is not None
        return reply

    def _loop(self) -> None:
        self._baton.to_lane.acquire()
        while not self._closing:
            try:
                self._outputs.extend(self.batcher.step())
            except BaseException as e:  # handed to the scheduler's thread
                self._error = e
            self.in_step = False
            self._baton.hand_back()
        self._baton.to_scheduler.release()


class PageBudget:
    """The cache pages a pipeline's lanes share: a stage's cache is sized (and placement
    reserves memory) for a runner's ``max_batch`` requests of the whole context, while the
    lanes hold more slots than that. A request starts when the most pages it may hold (its
    prompt and every token it may generate) are free, and gives them back when it ends."""

    def __init__(self, pages: int, max_seq: int) -> None:
        if pages < 1:
            raise ValueError("a page budget needs at least one page")
        self.free, self.max_seq = pages, max_seq

    def need(self, prompt_tokens: int, max_tokens: int) -> int:
        return pages_needed(prompt_tokens, max_tokens, self.max_seq)


@dataclass(frozen=True)
class _Waiting:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    images: ImageSpans | None
    pages: int


def lane_sizes(max_batch: int, lanes: int) -> list[int]:
    """``max_batch`` slots over at most ``lanes`` lanes, as evenly as they go."""
    n = max(1, min(lanes, max_batch))
    return [max_batch // n + (1 if i < max_batch % n else 0) for i in range(n)]


class PipelinedBatcher:
    """The batcher rank 0 of a pipeline runs: ``add``, ``cancel`` and ``step`` as a
    ``BatchGenerator``'s, over ``lanes`` lanes (``lane_count``: one per stage by default)."""

    def __init__(self, head: PipelineHead, lanes: int, max_batch: int,
                 make: BatcherFactory, budget: PageBudget) -> None:
        self.lanes: list[Lane] = []
        offset = 0
        for i, size in enumerate(lane_sizes(max_batch, lanes)):
            self.lanes.append(Lane(i, offset, size, head, make))
            offset += size
        self.budget = budget
        self._in_flight: deque[Lane] = deque()
        self._owner: dict[str, Lane] = {}
        self._ready: list[StepOutput] = []  # of steps finished early (for a cancel)
        self._waiting: deque[_Waiting] = deque()  # for pages and a slot, oldest first
        self._reserved: dict[str, int] = {}  # pages each request of the lanes took

    @property
    def active(self) -> int:
        return sum(lane.batcher.active for lane in self.lanes) + len(self._waiting)

    @property
    def running(self) -> int:
        return sum(lane.batcher.running for lane in self.lanes)

    def add(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
            images: ImageSpans | None = None) -> None:
        """Queue a request until its pages (``PageBudget``) and a lane's slot are free; then
        it goes to the lane with the fewest requests (the first such)."""
        if request_id in self._owner or any(w.request_id == request_id for w in self._waiting):
            raise ValueError(f"request {request_id!r} is already active")
        self.lanes[0].batcher.check(prompt_ids, images)  # refused now, not when it starts
        pages = self.budget.need(len(prompt_ids), params.max_tokens)
        self._waiting.append(_Waiting(request_id, list(prompt_ids), params, images, pages))
        self._admit()

    def _admit(self) -> None:
        """Hand the oldest waiting requests to lanes while their pages and a slot are free."""
        budget = self.budget
        while self._waiting:
            w = self._waiting[0]
            open_lanes = [ln for ln in self.lanes if ln.batcher.active < ln.size]
            if w.pages > budget.free or not open_lanes:
                return
            self._waiting.popleft()
            lane = min(open_lanes, key=lambda ln: ln.batcher.active / ln.size)
            try:
                lane.batcher.add(w.request_id, w.prompt_ids, w.params, w.images)
            except Exception as e:  # checked in add; this request only
                self._ready.append(StepOutput(w.request_id, None, "error", f"{type(e).__name__}: {e}"))
                continue
            budget.free -= w.pages
            self._reserved[w.request_id] = w.pages
            self._owner[w.request_id] = lane

    def _ended(self, request_id: str) -> None:
        self._owner.pop(request_id, None)
        self.budget.free += self._reserved.pop(request_id, 0)

    def cancel(self, request_id: str) -> bool:
        for w in self._waiting:
            if w.request_id == request_id:
                self._waiting.remove(w)
                return True
        lane = self._owner.get(request_id)
        if lane is None:
            return False
        self._ready.extend(self._finish(lane))
        cancelled = lane.batcher.cancel(request_id)
        self._ended(request_id)
        return cancelled

    def step(self) -> list[StepOutput]:
        """Start a step on every idle lane that has work, then take the oldest micro-batch's
        logits and carry its lane on; the outputs of every lane whose step ended."""
        self._admit()
        outputs, self._ready = self._ready, []
        for lane in self.lanes:
            if not lane.in_step and lane.batcher.active:
                lane.start_step()
                outputs.extend(self._after(lane))
        if self._in_flight:
            lane = self._in_flight.popleft()
            self._carry_on(lane)
            outputs.extend(self._after(lane))
        for out in outputs:
            if out.finish_reason is not None:
                self._ended(out.request_id)
        return outputs

    @staticmethod
    def _carry_on(lane: Lane) -> None:
        """Wait for a lane's logits and run it until it parks again or its step ends."""
        assert lane.pending is not None
        try:
            reply: Tensor | BaseException = lane.pending.wait()
        except Exception as e:  # the lane's batcher confines it to its requests
            reply = e
        lane.resume(reply)

    def _finish(self, lane: Lane) -> list[StepOutput]:
        """Carry a lane's step, if one is in flight, to its end; its outputs."""
        while lane.in_step:
            self._in_flight.remove(lane)
            self._carry_on(lane)
            if lane.in_step:  # its next forward is the newest in flight
                self._in_flight.append(lane)
        return lane.take_outputs()

    def _after(self, lane: Lane) -> list[StepOutput]:
        if lane.in_step:
            self._in_flight.append(lane)
            return []
        return lane.take_outputs()

    def held_slots(self) -> int:
        """Slots rank 0's caches hold (a finished or cancelled request holds none)."""
        return sum(lane.cache.held() for lane in self.lanes if lane.cache is not None)

    def close(self) -> int:
        """Finish the steps in flight, stop the lanes' threads; the slots rank 0 still held."""
        for lane in self.lanes:
            self._finish(lane)  # the caller ended these requests already
        held = self.held_slots()
        for lane in self.lanes:
            lane.close()
        return held


LANES_ENV = "EXO_PIPELINE_LANES"
LANES_PER_STAGE = 1


def lane_count(stages: int) -> int:
    """How many micro-batches a pipeline of ``stages`` keeps: ``EXO_PIPELINE_LANES`` when
    set, else ``LANES_PER_STAGE`` per stage."""
    raw = os.environ.get(LANES_ENV, "")
    if not raw:
        return LANES_PER_STAGE * stages
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{LANES_ENV} must be a whole number >= 1, not {raw!r}")
    return int(raw)


def pipeline_slots(max_batch: int, stages: int) -> int:
    """The slots of a pipeline of ``stages`` whose runners decode ``max_batch`` requests
    together: a micro-batch of ``max_batch`` per stage, so every stage has a whole batch to
    work on while the others work on theirs."""
    return max_batch * max(stages, 1)


def pipelined_batcher(head: PipelineHead, stages: int, slots: int, max_seq: int,
                      eos_token_ids: Sequence[int], pages: int) -> PipelinedBatcher:
    """Rank 0's batcher for a pipeline of ``stages`` (``lane_count`` micro-batches) over
    ``slots`` slots, the requests of every lane sharing ``pages`` cache pages (``PageBudget``)."""

    def make(model: LaneModel, lane_slots: int) -> BatchGenerator:
        return BatchGenerator(model, lane_slots, max_seq, eos_token_ids=eos_token_ids)

    return PipelinedBatcher(head, lane_count(stages), slots, make, PageBudget(pages, max_seq))
