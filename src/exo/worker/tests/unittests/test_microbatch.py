"""The micro-batch scheduler of a pipeline's rank 0 (``runner/microbatch.py``), in one
process: a stand-in stage 1 on a virtual clock shows the schedule (both stages busy at once
when there are two micro-batches of work, never with one), and a real two-stage split of a
tiny model shows that splitting rows into micro-batches leaves every request's tokens as
they are alone."""

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import Tensor

from exo.worker.engines.batch import BatchGenerator, StepOutput
from exo.worker.engines.config import LlamaConfig
from exo.worker.engines.engine import Shard, load_model
from exo.worker.engines.kv_cache import KVCache, pages_for
from exo.worker.engines.models.base import ShardModel, StepInputs
from exo.worker.engines.sampling import SamplingParams
from exo.worker.engines.tests.tiny_models import write_tiny_model
from exo.worker.runner.microbatch import (
    LANES_ENV,
    BatcherFactory,
    LaneModel,
    PageBudget,
    PipelinedBatcher,
    lane_count,
    lane_sizes,
    pipelined_batcher,
)
from exo.worker.runner.stage_trace import StageTrace, busy_fractions, format_traces, overlap

VOCAB = 32


def _config() -> LlamaConfig:
    return LlamaConfig(
        architecture="llama", n_layers=2, hidden=8, ffn=16, heads=2, kv_heads=1, head_dim=4,
        rope_theta=10000.0, rms_eps=1e-5, vocab=VOCAB, context_length=64, tie_embeddings=False,
        bos_token_id=None, eos_token_ids=(), chat_template=None,
    )  # fmt: skip


@dataclass
class _Ready:
    logits: Tensor
    at: float
    clock: "VirtualStages"

    def wait(self) -> Tensor:
        self.clock.now = max(self.clock.now, self.at)
        return self.logits


class VirtualStages:
    """Stage 0 (here) and stage 1 (a stand-in) on a virtual clock: each step takes one unit
    on each stage; stage 1 takes steps in the order they were sent, when it is free. The
    logits make every row's next token its last token + 1."""

    def __init__(self) -> None:
        self.now = 0.0
        self.stage1_free = 0.0
        self.traces = (StageTrace(0), StageTrace(1))
        self.mirrored: list[tuple[str, int]] = []
        self.rows_seen: list[tuple[int, tuple[int, ...]]] = []

    @property
    def config(self) -> LlamaConfig:
        return _config()

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def new_local_cache(self, max_batch: int, max_seq: int) -> KVCache:
        return KVCache(1, max_batch, max_seq, 1, 4, dtype=torch.float32, device=self.device)

    def launch(self, tokens: Tensor, local: StepInputs, routed: StepInputs, cache: KVCache,
               every_position: bool, lane: int) -> _Ready:
        cache.prepare(local.slots, local.starts, local.n_new)
        self.traces[0].record(lane, self.now, self.now + 1)
        self.now += 1
        start = max(self.now, self.stage1_free)
        self.stage1_free = start + 1
        self.traces[1].record(lane, start, start + 1)
        self.rows_seen.append((lane, routed.slots))
        nxt = (tokens[:, -1] + 1) % VOCAB
        logits = torch.nn.functional.one_hot(nxt, VOCAB).to(torch.float32)
        if every_position:
            logits = logits[:, None].expand(-1, tokens.shape[1], -1)
        return _Ready(logits, self.stage1_free, self)

    def mirror_move(self, src: int, dst: int, length: int) -> None:
        self.mirrored.append(("move", src))

    def mirror_release(self, slot: int) -> None:
        self.mirrored.append(("release", slot))


def _params(rid: str, max_tokens: int) -> SamplingParams:
    """Greedy, or (an id ending in an odd digit) sampled with a seed of its own."""
    if int(rid[-1]) % 2 == 0:
        return SamplingParams(temperature=0.0, max_tokens=max_tokens)
    return SamplingParams(temperature=0.9, top_p=0.95, seed=int(rid[-1]), max_tokens=max_tokens)


def _run(batcher: PipelinedBatcher | BatchGenerator, requests: dict[str, list[int]],
         max_tokens: int) -> dict[str, list[int]]:
    tokens: dict[str, list[int]] = {r: [] for r in requests}
    for rid, prompt in requests.items():
        batcher.add(rid, prompt, _params(rid, max_tokens))
    for _ in range(1000):
        if not batcher.active:
            return tokens
        out: StepOutput
        for out in batcher.step():
            assert out.error is None
            if out.token_id is not None:
                tokens[out.request_id].append(out.token_id)
    raise AssertionError("the batcher did not finish")


def _ample(max_seq: int) -> PageBudget:
    """Pages for more requests of the whole context than any of these tests runs."""
    return PageBudget(64 * pages_for(max_seq), max_seq)


def _make(max_seq: int) -> BatcherFactory:
    def make(model: LaneModel, slots: int) -> BatchGenerator:
        return BatchGenerator(model, slots, max_seq)

    return make


def test_two_micro_batches_keep_both_stages_busy() -> None:
    stages = VirtualStages()
    batcher = PipelinedBatcher(stages, 2, 4, _make(32), _ample(32))
    out = _run(batcher, {f"r{i}": [i, i + 1] for i in (0, 2, 4, 6)}, max_tokens=6)
    assert out == {f"r{i}": [(i + 2 + k) % VOCAB for k in (0, 1, 2, 3, 4, 5)] for i in (0, 2, 4, 6)}
    both = overlap(*stages.traces)
    assert both > 0.0
    fractions = busy_fractions(stages.traces)
    # Steady state: each stage busy every unit, so at least 80% over the whole run.
    assert min(fractions.values()) >= 0.8, (fractions, format_traces(stages.traces))
    # The two lanes alternate on stage 0, and their rows sit in disjoint slot ranges.
    lanes = [b.lane for b in stages.traces[0].intervals]
    assert lanes[:4] == [0, 1, 0, 1]
    slots = {lane: set(s) for lane, s in stages.rows_seen}
    assert slots[0].isdisjoint(slots[1])
    assert batcher.held_slots() == 0


def test_one_micro_batch_leaves_the_stages_taking_turns() -> None:
    stages = VirtualStages()
    batcher = PipelinedBatcher(stages, 2, 4, _make(32), _ample(32))
    out = _run(batcher, {"only0": [3, 4]}, max_tokens=5)
    assert out == {"only0": [5, 6, 7, 8, 9]}
    assert overlap(*stages.traces) == 0.0
    assert "stage 1: busy" in format_traces(stages.traces)
    assert stages.traces[1].summary().startswith("stage 1: 5 steps, busy 5.00 s of 9.00 s (56%)")


def test_a_cancel_mid_step_finishes_the_step_frees_the_slot_everywhere_keeps_the_rest() -> None:
    stages = VirtualStages()
    batcher = PipelinedBatcher(stages, 2, 4, _make(32), _ample(32))
    requests = {"a0": [1, 2], "b0": [3, 4], "c0": [5, 6], "d0": [7, 8]}  # lanes 0, 1, 0, 1
    for rid, prompt in requests.items():
        batcher.add(rid, prompt, SamplingParams(temperature=0.0, max_tokens=6))
    tokens: dict[str, list[int]] = {rid: [] for rid in requests}

    def collect(outputs: list[StepOutput]) -> None:
        for out in outputs:
            assert out.error is None and out.token_id is not None
            tokens[out.request_id].append(out.token_id)

    collect(batcher.step())  # both lanes launched; lane 0's first step completed
    lane_b = batcher.lanes[1]
    assert lane_b.in_step and not stages.mirrored  # b's and d's step is in flight
    assert batcher.cancel("b0")
    # The step finished first; then b's slot (1 of lane 1, at offset 2) went on every stage.
    assert not lane_b.in_step and stages.mirrored == [("move", 3)]
    assert lane_b.cache is not None and lane_b.cache.held() == 1  # d's alone
    while batcher.active:
        collect(batcher.step())
    assert tokens["b0"] == [5]  # the token of the step it was cancelled in (the caller drops it)
    for rid in ("a0", "c0", "d0"):  # nothing of the others lost
        start = requests[rid][-1] + 1
        assert tokens[rid] == [start + k for k in range(6)], rid
    assert batcher.held_slots() == 0
    assert not batcher.cancel("b0")
    with pytest.raises(ValueError, match="already active"):
        batcher.add("x0", [1], SamplingParams(max_tokens=1))
        batcher.add("x0", [1], SamplingParams(max_tokens=1))


def test_more_micro_batches_than_stages_keep_the_tokens_and_both_stages_busy() -> None:
    stages = VirtualStages()
    batcher = PipelinedBatcher(stages, 4, 8, _make(32), _ample(32))
    assert [lane.size for lane in batcher.lanes] == [2, 2, 2, 2]
    greedy = range(0, 16, 2)  # (an odd id samples)
    out = _run(batcher, {f"r{i}": [i, i + 1] for i in greedy}, max_tokens=6)
    assert out == {f"r{i}": [(i + 2 + k) % VOCAB for k in range(6)] for i in greedy}
    assert min(busy_fractions(stages.traces).values()) >= 0.8
    assert {b.lane for b in stages.traces[1].intervals} == {0, 1, 2, 3}
    assert batcher.held_slots() == 0


def test_lane_count_is_one_per_stage_unless_the_environment_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(LANES_ENV, raising=False)
    assert lane_count(3) == 3
    monkeypatch.setenv(LANES_ENV, "4")
    assert lane_count(2) == 4
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(LANES_ENV, bad)
        with pytest.raises(ValueError, match=LANES_ENV):
            lane_count(2)


def test_lane_sizes_cover_every_slot() -> None:
    assert lane_sizes(8, 3) == [3, 3, 2]
    assert lane_sizes(1, 3) == [1]
    assert sum(lane_sizes(5, 2)) == 5


class InProcessPipeline:
    """Two real stages of a tiny model in this process: stage 1 runs at once on its own
    cache, at the slots the step is routed to."""

    def __init__(self, first: ShardModel, second: ShardModel, max_batch: int) -> None:
        self.first, self.second = first, second
        self.follower_cache = second.new_cache(max_batch, 64)

    @property
    def config(self) -> LlamaConfig:
        return self.first.config

    @property
    def device(self) -> torch.device:
        return self.first.device

    def new_local_cache(self, max_batch: int, max_seq: int) -> KVCache:
        return self.first.new_cache(max_batch, max_seq)

    def launch(self, tokens: Tensor, local: StepInputs, routed: StepInputs, cache: KVCache,
               every_position: bool, lane: int) -> _Ready:
        hidden = self.first.forward_layers(self.first.embed(tokens), local, cache)
        hidden = self.second.forward_layers(hidden, routed, self.follower_cache)
        logits = self.second.head(hidden if every_position else hidden[:, -1])
        return _Ready(logits, 0.0, VirtualStages())

    def mirror_move(self, src: int, dst: int, length: int) -> None:
        self.follower_cache.move_slot(src, dst, length)

    def mirror_release(self, slot: int) -> None:
        self.follower_cache.release(slot)


def test_micro_batches_give_each_request_its_tokens_alone(tmp_path: Path) -> None:
    write_tiny_model(tmp_path, "llama")
    _, whole = load_model(tmp_path, cache_dir=tmp_path / "c")
    _, first = load_model(tmp_path, Shard(0, 2), cache_dir=tmp_path / "c")
    _, second = load_model(tmp_path, Shard(2, 3), cache_dir=tmp_path / "c")
    prompts = {f"r{i}": [(7 * i + j) % 150 + 3 for j in range(3 + 2 * i)] for i in range(5)}
    alone = {
        rid: _run(BatchGenerator(whole, 1, 64), {rid: p}, 8)[rid] for rid, p in prompts.items()
    }
    split = pipelined_batcher(InProcessPipeline(first, second, 5), 3, 5, 64, (),
                              pages=5 * pages_for(64))
    with torch.inference_mode():
        assert _run(split, prompts, 8) == alone
    assert split.held_slots() == 0


def test_lanes_share_the_cache_pages_a_runner_is_sized_for() -> None:
    # 4 slots over 2 lanes, pages for 2 requests: the third and fourth wait for pages (in
    # arrival order), and every request gives its pages back when it ends or is cancelled
    split = pipelined_batcher(VirtualStages(), 2, 4, 64, (), pages=2)
    budget = split.budget
    for i in range(4):
        split.add(f"r{i}", [3, 4, 5], _params(f"r{2 * i}", 6))  # greedy, 6 tokens each
    firsts: list[str] = []
    ended: list[str] = []
    with torch.inference_mode():
        for _ in range(200):
            if not split.active:
                break
            for out in split.step():
                if out.request_id not in firsts:
                    firsts.append(out.request_id)
                if out.finish_reason is not None:
                    ended.append(out.request_id)
            assert split.running <= 2 and budget.free >= 0
    assert not split.active and budget.free == 2
    assert firsts == ["r0", "r1", "r2", "r3"] and set(ended[:2]) == {"r0", "r1"}
    # a cancelled running request frees its pages for the next one at once
    split.add("a0", [3, 4], _params("a0", 50))
    split.add("a2", [3, 4], _params("a2", 50))
    split.add("a4", [3, 4], _params("a4", 50))
    with torch.inference_mode():
        split.step()
        split.step()
    assert split.running == 2 and budget.free == 0
    assert split.cancel("a0")
    assert budget.free == 1
    with torch.inference_mode():
        outs = [o.request_id for _ in range(3) for o in split.step()]
    assert "a4" in outs and split.running == 2
    split.cancel("a2")
    split.cancel("a4")
    assert budget.free == 2 and split.held_slots() == 0
    with pytest.raises(ValueError, match="holds 64"):  # refused at once, not when it starts
        split.add("long", [3] * 64, _params("long0", 4))
    assert not split.active
