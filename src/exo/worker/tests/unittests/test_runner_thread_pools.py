"""A runner sizes torch's thread pools before torch loads, and keeps OpenMP from spinning."""

import os
import subprocess
import sys

from exo.worker.runner.bootstrap import size_thread_pools


def test_pools_get_the_runner_threads_and_openmp_waits_passively() -> None:
    env: dict[str, str] = {}
    size_thread_pools(env, 3)
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "3"
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"


def test_a_wait_policy_the_user_chose_is_kept() -> None:
    env = {"OMP_WAIT_POLICY": "ACTIVE"}
    size_thread_pools(env, 2)
    assert env["OMP_WAIT_POLICY"] == "ACTIVE"


def test_torch_openmp_workers_do_not_spin_after_a_parallel_op() -> None:
    """With the runner's environment, torch's idle OpenMP worker sleeps: 50 parallel ops, each
    followed by a pause, cost about what they cost on one thread, not the milliseconds per
    pause that libgomp's worker spins by default (measured: +10-20 ms passive, +300 ms
    spinning). Both runs in one process, one after the other, so a busy machine slows both."""
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    size_thread_pools(env, 2)
    code = (
        "import time, torch\n"
        "x = torch.randn(1 << 20)\n"
        "def run():\n"
        "    cpu = time.process_time()\n"
        "    for _ in range(50):\n"
        "        (x * 2).sum()\n"
        "        time.sleep(0.005)\n"
        "    return time.process_time() - cpu\n"
        "torch.set_num_threads(1); run(); one = run()\n"
        "torch.set_num_threads(2); run(); two = run()\n"
        "print(one, two)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    one, two = map(float, done.stdout.split())
    # a spinning worker adds ~5 ms of CPU per pause: 0.25 s over the 50
    assert two - one < 0.1, (one, two)
