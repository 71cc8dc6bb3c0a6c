"""The first code a runner process runs (spawned, so it imports little before setup)."""

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Generator, MutableMapping
from contextlib import contextmanager

from anyio import ClosedResourceError
from loguru import logger

from exo.shared.types.events import Event, RunnerStatusUpdated
from exo.shared.types.tasks import Task, TaskId
from exo.shared.types.worker.instances import BoundInstance
from exo.shared.types.worker.runners import RunnerFailed
from exo.utils.channels import MpReceiver, MpSender
from exo.worker.runner.settings import RunnerSettings

_PR_SET_PDEATHSIG = 1
# torch's OpenMP workers spin (libgomp: ~300k pauses, milliseconds) after every parallel region
# unless told not to; next to the kernels' own pool that is one busy thread too many (measured,
# SmolLM2 decode at 2 threads: 38.7 ms of CPU a token against 27.8 with PASSIVE, 12.5 at one
# thread). Decode runs in the kernels; torch's ops there are small.
QUIET_OPENMP = "PASSIVE"


POOL_SIZE_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
POOL_VARS = (*POOL_SIZE_VARS, "OMP_WAIT_POLICY")
"""Every variable `size_thread_pools` may set."""


def size_thread_pools(env: MutableMapping[str, str], threads: int) -> None:
    """Size every thread pool before torch is imported (several runners share the cores), and
    keep OpenMP's idle workers from spinning unless the user chose a wait policy."""
    for var in POOL_SIZE_VARS:
        env[var] = str(threads)
    env.setdefault("OMP_WAIT_POLICY", QUIET_OPENMP)


_SPAWNING = threading.Lock()


@contextmanager
def child_thread_pools(threads: int) -> Generator[None]:
    """Start a runner process inside this: its environment then holds the pool sizes and
    the wait policy from its first instruction. Setting them in `entrypoint` alone is too
    late: a spawned child first imports the parent's main module (the `exo` command: the
    node, hence torch and its OpenMP runtime, which reads them once, at load), so a
    2-thread runner had a spinning OpenMP worker as a third busy thread on its two cores
    (measured: 1B-shaped decode 33 -> 37 tok/s through a node once it went). The node's own
    environment is restored on leaving (under a lock: runners may start concurrently)."""
    with _SPAWNING:
        saved = {var: os.environ.get(var) for var in POOL_VARS}
        size_thread_pools(os.environ, threads)
        try:
            yield
        finally:
            for var, value in saved.items():
                if value is None:
                    os.environ.pop(var, None)
                else:
                    os.environ[var] = value


def _die_with_parent() -> None:
    """Linux: have the kernel kill this process if the node process dies (no orphans)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        logger.warning("could not ask to die with the parent process")


def entrypoint(
    bound_instance: BoundInstance,
    event_sender: MpSender[Event],
    task_receiver: MpReceiver[Task],
    cancel_receiver: MpReceiver[TaskId],
    settings: RunnerSettings,
) -> None:
    _die_with_parent()
    # Ctrl-C reaches the whole process group; the node decides when its runners stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    size_thread_pools(os.environ, settings.threads)
    logger.remove()
    logger.add(
        sys.stderr,
        level=settings.log_level,
        backtrace=False,
        diagnose=False,
        format=f"<dim>runner {bound_instance.bound_runner_id[:8]}</dim> {{level}} {{message}}",
    )
    try:
        from exo.worker.runner.runner import Runner

        runner = Runner(bound_instance, event_sender, task_receiver, cancel_receiver, settings)
        runner.run()
    except Exception as e:  # even a broken install is reported as data, not a bare exit code
        logger.opt(exception=e).error("runner could not start")
        try:
            event_sender.send(
                RunnerStatusUpdated(
                    runner_id=bound_instance.bound_runner_id,
                    runner_status=RunnerFailed(error_message=f"{type(e).__name__}: {e}"),
                )
            )
        except ClosedResourceError:
            pass  # the node is gone: nobody to tell
    finally:
        event_sender.close()
        if bound_instance.instance.world_size > 1:
            # A follower thread may still sit in a collective of the dissolving group;
            # interpreter teardown would abort on it, so leave at once (pipes are flushed).
            sys.stderr.flush()
            os._exit(0)
