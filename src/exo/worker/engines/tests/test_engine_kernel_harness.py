"""The C kernels' standalone harness (`csrc/harness/`), built from the same sources with
AddressSanitizer and UndefinedBehaviorSanitizer and run in its own process (no torch there):
every kernel against plain C references on random shapes, the thread pool resized between
calls, several threads calling at once. Any mismatch or sanitizer report fails."""

import os
import subprocess
from pathlib import Path

import pytest

from exo.worker.engines.kernel_build import Isa, build_harness, cpu_has_avx2, find_compiler

pytestmark = [pytest.mark.slow]


def _isas() -> list[Isa]:
    return ["avx2", "portable"] if cpu_has_avx2() else ["portable"]


@pytest.mark.parametrize("isa", _isas())
def test_kernels_pass_the_sanitized_harness(isa: Isa, tmp_path: Path) -> None:
    compiler = find_compiler()
    if compiler is None:
        pytest.skip("no C compiler (cc, gcc, clang or $CC): the kernels cannot be built here")
    exe = tmp_path / f"harness-{isa}"
    build_harness(compiler, isa, exe)
    env = {
        **os.environ,
        "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:exitcode=99",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1:exitcode=98",
    }
    for seed in (1, 2, 3):
        done = subprocess.run(
            [str(exe), str(seed), "40"], capture_output=True, text=True, timeout=600, env=env
        )
        report = f"seed {seed}:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
        assert done.returncode == 0, report
        assert f"isa {isa}" in done.stdout, report
        assert "passed: 0 failures" in done.stdout, report
        assert "Sanitizer" not in done.stderr and "runtime error" not in done.stderr, report
