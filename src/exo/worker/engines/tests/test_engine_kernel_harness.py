"""The C kernels' standalone harness (`csrc/harness/`), built from the same sources with
AddressSanitizer and UndefinedBehaviorSanitizer and run in its own process (no torch there):
every kernel against plain C references on random shapes, the thread pool resized between
calls, several threads calling at once. Any mismatch or sanitizer report fails."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from exo.worker.engines.kernel_build import ISAS, Isa, build_harness, find_compiler, runnable_isas

pytestmark = [pytest.mark.slow]


@pytest.mark.parametrize("isa", ISAS)
def test_kernels_pass_the_sanitized_harness(isa: Isa, tmp_path: Path) -> None:
    """Each build this CPU can run (the others skip, naming the build)."""
    if isa not in runnable_isas():
        pytest.skip(f"this CPU cannot run the {isa} build")
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


def test_without_a_compiler_the_q4_q8_tests_skip_saying_why(tmp_path: Path) -> None:
    """A machine with no C compiler (CC names none): the engine tests of the formats that need
    the kernels skip with the reason, and nothing fails."""
    root = Path(__file__).resolve().parents[5]
    if not (root / "pyproject.toml").exists():
        pytest.skip("needs the source tree (pyproject.toml) to run pytest in a subprocess")
    env = {**os.environ, "CC": str(tmp_path / "no-such-cc"), "TMPDIR": str(tmp_path)}
    tests = Path(__file__).parent
    done = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-c", str(root / "pyproject.toml"), "-q", "-rs",
            str(tests / "test_engine_safetensors.py"),
            str(tests / "test_engine_kernels.py"), "-k", "q4-llama or q8 or threaded_linear",
        ],
        capture_output=True, text=True, timeout=600, env=env, cwd=root,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "failed" not in out, out
    assert "the q4 format needs the compiled CPU kernels: no C compiler" in out, out
    assert "the q8 format needs the compiled CPU kernels: no C compiler" in out, out
