"""Skipping the tests of formats that need the compiled CPU kernels where they cannot be built."""

import pytest

from exo.worker.engines.cpu_kernels import kernels_unavailable_reason, load_kernels


def skip_without_kernels(fmt: str) -> None:
    """q4 and q8 run only on the compiled kernels: skip (saying why) where there are none."""
    if fmt in ("q4", "q8") and load_kernels() is None:
        why = kernels_unavailable_reason() or "their build failed (the log has the compiler output)"
        pytest.skip(f"the {fmt} format needs the compiled CPU kernels: {why}")
