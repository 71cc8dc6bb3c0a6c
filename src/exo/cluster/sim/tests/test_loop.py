"""The virtual clock's CPU charging: each simulated machine pays for its own work."""

import time

import anyio

from exo.cluster.sim.loop import Machine, VirtualTimeLoop, run_on


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
