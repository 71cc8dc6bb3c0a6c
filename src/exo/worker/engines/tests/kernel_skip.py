"""Skipping the tests of formats that need the compiled CPU kernels where they cannot be built."""

import pytest

from exo.worker.engines.cpu_kernels import (
    QKernels,
    kernels_unavailable_reason,
    load_kernels,
    load_kernels_for,
)
from exo.worker.engines.kernel_build import Isa, cpu_runs


def skip_without_kernels(fmt: str) -> None:
    """q4 and q8 run only on the compiled kernels: skip (saying why) where there are none."""
    if fmt in ("q4", "q8") and load_kernels() is None:
        why = kernels_unavailable_reason() or "their build failed (the log has the compiler output)"
        pytest.skip(f"the {fmt} format needs the compiled CPU kernels: {why}")


def kernels_for_isa(isa: Isa) -> QKernels:
    """The `isa` build of the kernels, or a skip saying why this machine has none: a CPU that
    cannot run it, or a build that failed here."""
    if not cpu_runs(isa):
        pytest.skip(f"this CPU cannot run the {isa} build (the paths it can run are tested)")
    k = load_kernels_for(isa)
    if k is None:
        pytest.skip(kernels_unavailable_reason() or f"the {isa} kernels did not build here (see the log)")
    return k
