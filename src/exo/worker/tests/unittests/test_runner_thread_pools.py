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
    """With the runner's environment, torch's idle OpenMP worker sleeps: a parallel op followed
    by a pause costs about the op's CPU time, not the milliseconds libgomp spins by default."""
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    size_thread_pools(env, 2)
    code = (
        "import time, torch\n"
        "x = torch.randn(1 << 20)\n"
        "cpu = time.process_time()\n"
        "for _ in range(50):\n"
        "    (x * 2).sum()\n"
        "    time.sleep(0.005)\n"
        "print(time.process_time() - cpu)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    # 50 ops of ~1 ms of CPU at most; a spinning worker adds up to ~5 ms per pause
    assert float(done.stdout) < 0.15, done.stdout
