"""The pipeline stages' ring of TCP streams (stage_link), over real processes on 127.0.0.1:
frames go round in order, rank 0's logits reader keeps a ring of full streams from locking
up, a closed peer is a "lost the group" error, and a stranger's connection is refused."""

import multiprocessing
import os
import socket
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from exo.worker.runner.stage_link import LinkClosed, LogitsReader, StageLink, open_link

pytestmark = pytest.mark.slow

MB_ROWS, WIDTH = 512, 4096  # 8 MiB of float32: far more than a socket's buffer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _recorded(target: Callable[[int, int, int], None], rank: int, world: int, port: int,
              out: Path) -> None:
    """A rank's process: ``target(rank, world, port)``, then ``ok<rank>`` in ``out``, or
    ``error<rank>`` with the traceback if it raised."""
    try:
        target(rank, world, port)
    except BaseException:
        (out / f"error{rank}").write_text(traceback.format_exc())
        raise
    (out / f"ok{rank}").write_text("ok")


def _run_ranks(target: Callable[[int, int, int], None], world: int, out: Path) -> None:
    """``target(rank, world, port)`` in ``world`` fresh processes (``_recorded``); wait for
    them all."""
    port = _free_port()
    ctx = multiprocessing.get_context("spawn")
    ranks = [ctx.Process(target=_recorded, args=(target, r, world, port, out)) for r in range(world)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(90)
        if p.is_alive():
            p.kill()


def _join(rank: int, world: int, port: int) -> StageLink:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))  # fmt: skip
    return open_link(rank, world, "127.0.0.1", 60)


def _ring(rank: int, world: int, port: int) -> None:
    """Rank 0 sends 4 big steps before taking any logits; the others pass them on, the last
    answers each with big logits: without the reader, rank 0 and the last rank would each
    block on a full stream to the other."""
    link = _join(rank, world, port)
    steps = 4
    if rank == 0:
        reader = LogitsReader(link)
        numbers = []
        for i in range(steps):
            numbers.append(reader.expect((MB_ROWS, WIDTH)))
            link.send(torch.tensor([i]), torch.full((MB_ROWS, WIDTH), float(i)))
        got = [float(reader.take(n)[-1, -1]) for n in numbers]
        assert got == [i + 10.0 * (world - 1) for i in range(steps)], got
        with pytest.raises(RuntimeError, match="taken before"):
            reader.take(numbers[-1] + 2)
        reader.close()
    else:
        for _ in range(steps):
            i = int(link.recv_into(torch.empty(1, dtype=torch.int64))[0])
            x = link.recv_into(torch.empty(MB_ROWS, WIDTH)) + 10.0
            link.send(x) if rank == world - 1 else link.send(torch.tensor([i]), x)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_steps_go_round_the_ring_in_order_with_every_stream_full(world: int, tmp_path: Path) -> None:
    _run_ranks(_ring, world, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"ok{r}" for r in range(world)]


def _lost(rank: int, world: int, port: int) -> None:
    link = _join(rank, world, port)
    if rank == 1:
        link.recv_into(torch.empty(1, dtype=torch.int64))
        os._exit(0)  # gone mid-pipeline, as a killed runner is
    reader = LogitsReader(link)
    step = reader.expect((1, 8))
    link.send(torch.tensor([7]))
    try:
        reader.take(step)
    except LinkClosed as e:
        assert "lost the group" in str(e) and "rank 1" in str(e), e
        return
    raise AssertionError("the logits of a lost rank were taken")


@pytest.mark.timeout(120)
def test_a_lost_stage_is_a_lost_group_on_rank_0(tmp_path: Path) -> None:
    _run_ranks(_lost, 2, tmp_path)
    assert (tmp_path / "ok0").exists(), [p.read_text() for p in tmp_path.glob("error*")]


def _stranger(rank: int, world: int, port: int) -> None:
    """Rank 1 connects a stranger (wrong nonce) to rank 0's listener before its own
    connection: rank 0 must drop it and take rank 1's."""
    import exo.worker.runner.stage_link as stage_link

    if rank == 1:
        original = stage_link.socket.create_connection

        def first_a_stranger(address: tuple[str, int], timeout: float) -> socket.socket:
            bad = original(address, timeout)
            bad.sendall(b"\x00" * 16 + (1).to_bytes(8, "little"))
            return original(address, timeout)

        stage_link.socket.create_connection = first_a_stranger  # pyright: ignore[reportAttributeAccessIssue]
    link = _join(rank, world, port)
    if rank == 0:
        link.send(torch.tensor([41]))
    else:
        assert int(link.recv_into(torch.empty(1, dtype=torch.int64))[0]) == 41


@pytest.mark.timeout(120)
def test_a_connection_without_the_groups_nonce_is_refused(tmp_path: Path) -> None:
    _run_ranks(_stranger, 2, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok0", "ok1"]
