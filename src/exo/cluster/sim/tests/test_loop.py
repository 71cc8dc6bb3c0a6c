"""The virtual clock's CPU charging: each simulated machine pays for its own work."""

import gc
import time

import anyio

from exo.cluster.sim.loop import Machine, VirtualTimeLoop, not_charged, run_on


def _burn(seconds: float) -> None:
    started = time.process_time()
    while time.process_time() - started < seconds:
        pass


def _run(charge_cpu: bool) -> dict[str, float]:
    """Machine a burns 0.2 s of CPU, then takes one more step; machine b only takes steps.
    Returns the virtual times at which each finished."""
    a, b = Machine("a"), Machine("b")
    done: dict[str, float] = {}

    async def busy() -> None:
        run_on(a)
        await anyio.sleep(0.01)
        _burn(0.2)
        await anyio.sleep(0)  # the next step waits for the machine
        done["a"] = anyio.current_time()

    async def idle() -> None:
        run_on(b)
        for _ in range(5):
            await anyio.sleep(0.01)
        done["b"] = anyio.current_time()

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(busy)
            tg.start_soon(idle)
            _burn(0.05)  # the harness's own work (on no machine) costs nothing
        done["a_cpu"], done["b_cpu"] = a.cpu_s, b.cpu_s

    anyio.run(main, backend="asyncio",
              backend_options={"loop_factory": lambda: VirtualTimeLoop(charge_cpu=charge_cpu)})
    return done


def test_a_machine_pays_for_its_own_cpu_time_and_no_other() -> None:
    done = _run(charge_cpu=True)
    assert done["a"] >= 0.01 + 0.2  # its next step waited until it had done that work
    assert done["a_cpu"] >= 0.2
    assert done["b"] < 0.05 + 0.02  # the other machine went on meanwhile
    assert done["b_cpu"] < 0.02


def test_without_charging_the_clock_only_moves_with_timers() -> None:
    done = _run(charge_cpu=False)
    assert done["a"] == 0.01
    assert abs(done["b"] - 0.05) < 1e-9


def test_the_simulators_own_work_and_the_garbage_collector_cost_no_machine() -> None:
    """Delivering a message to N nodes is the network's work, and a collection walks
    every simulated node's heap (one process holds them all): charged to the step they
    interrupted, they stalled a node of a 64-node cluster for seconds."""
    a = Machine("a")
    spent: dict[str, float] = {}
    heap = [[] for _ in range(2_000_000)]  # a heap for the collector to walk

    async def step() -> None:
        run_on(a)
        await anyio.sleep(0.01)
        with not_charged():
            _burn(0.1)
        started = time.process_time()
        gc.collect()
        spent["gc"] = time.process_time() - started
        await anyio.sleep(0)
        spent["done"] = anyio.current_time()

    anyio.run(step, backend="asyncio",
              backend_options={"loop_factory": lambda: VirtualTimeLoop(charge_cpu=True)})
    del heap
    assert spent["gc"] > 0.03, spent
    assert a.cpu_s < 0.02, (a.cpu_s, spent)
    assert spent["done"] < 0.01 + 0.02
