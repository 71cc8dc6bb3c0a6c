"""Rank 0 of a real two-rank gloo group on 127.0.0.1: slot moves and releases go to stage 1
without waiting for it to take them (stage 1 may be busy with another micro-batch's step,
and rank 0 has the next lane's step to run), and stage 1 still gets them in order, before
what rank 0 sends after them."""

import multiprocessing as mp
import queue
import threading
from datetime import timedelta
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from types import SimpleNamespace
from typing import cast

import pytest
import torch
import torch.distributed as dist

from exo.tests.node_process import free_port
from exo.worker.engines.config import LlamaConfig
from exo.worker.engines.models.base import ShardModel
from exo.worker.runner.distributed import LeaderModel, _Header  # pyright: ignore[reportPrivateUsage]

pytestmark = pytest.mark.slow

MAX_BATCH = 4
DEADLINE_S = 20.0


def _join(port: int, rank: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=timedelta(seconds=60))  # fmt: skip


def _leader(port: int, go: Event, out: "Queue[str]") -> None:
    _join(port, 0)
    config = LlamaConfig(
        architecture="llama", n_layers=2, hidden=8, ffn=16, heads=2, kv_heads=1, head_dim=4,
        rope_theta=10000.0, rms_eps=1e-5, vocab=32, context_length=64, tie_embeddings=False,
        bos_token_id=None, eos_token_ids=(), chat_template=None,
    )  # fmt: skip
    local = SimpleNamespace(config=config, device=torch.device("cpu"), weight_format="dense")
    leader = LeaderModel(cast(ShardModel, local), "pipeline", 2, MAX_BATCH)

    def mirror() -> None:
        leader.mirror_release(3)
        leader.mirror_move(2, 1, 5)
        leader.mirror_release(2)

    worker = threading.Thread(target=mirror, daemon=True)
    worker.start()
    worker.join(DEADLINE_S)  # stage 1 takes nothing until `go`
    out.put("returned" if not worker.is_alive() else "blocked")
    go.set()
    worker.join(DEADLINE_S)
    leader.stop()
    dist.destroy_process_group()


def _stage1(port: int, go: Event, out: "Queue[str]") -> None:
    _join(port, 1)
    go.wait(2 * DEADLINE_S)
    header = _Header(MAX_BATCH)
    for _ in range(4):
        h = torch.empty(header.length, dtype=torch.int64)
        dist.recv(h, src=0)
        out.put(" ".join(str(int(v)) for v in h[:4]))
    dist.destroy_process_group()


def test_moves_and_releases_do_not_wait_for_a_busy_stage_and_arrive_in_order() -> None:
    ctx = mp.get_context("spawn")
    port = free_port()
    go = ctx.Event()
    from_leader: Queue[str] = ctx.Queue()
    from_stage1: Queue[str] = ctx.Queue()
    procs = [ctx.Process(target=_leader, args=(port, go, from_leader)),
             ctx.Process(target=_stage1, args=(port, go, from_stage1))]  # fmt: skip
    for p in procs:
        p.start()
    try:
        assert from_leader.get(timeout=3 * DEADLINE_S) == "returned"
        got = [from_stage1.get(timeout=DEADLINE_S) for _ in range(4)]
        # op, slot / (src, dst, length): release 3, move 2 -> 1, release 2, then the stop
        assert got == ["3 3 0 0", "2 2 1 5", "3 2 0 0", "0 0 0 0"]
    except queue.Empty as e:
        raise AssertionError("a rank did not report in time") from e
    finally:
        for p in procs:
            p.join(DEADLINE_S)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0, 0]
