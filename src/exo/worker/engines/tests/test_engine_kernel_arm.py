"""The aarch64 kernel builds (`kernel_build`'s aarch64 part, `csrc/arch/arm/`): run-time dispatch
by the CPU's features (fast, pure), and the kernels themselves cross-compiled with Debian's
`gcc-aarch64-linux-gnu` and run under `qemu-aarch64` (slow; skipped, saying why, where either
tool is absent): the harness (UBSan) for the `portable` and `neon-dotprod` builds, every kind's
16- and 8-bit dots against the harness's references, and the NEON build's outputs against the
portable build's (and this machine's x86 portable build's) bit for bit. Speed cannot be measured
under qemu: it is not."""

import os
import platform
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from exo.worker.engines import kernel_build
from exo.worker.engines.kernel_build import (
    ARM_FLAGS,
    HWCAP_ASIMD,
    HWCAP_ASIMDDP,
    ISA_FLAGS,
    Isa,
    arm_cpu_flags,
    build_cross_harness,
    build_harness,
    build_library,
    choose_isa,
    find_compiler,
    hwcap_features,
    library_flags,
    parse_arm_features,
    runnable_isas,
    target_flags,
)

# /proc/cpuinfo's Features of a Neoverse N1 (Graviton 2: dotprod) and a Cortex-A72 (Pi 4: none)
N1 = "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs"
A72 = "processor\t: 0\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm crc32 cpuid\nCPU implementer\t: 0x41"
ARM_BUILDS: tuple[Isa, ...] = ("portable", "neon-dotprod")
CROSS_CC, QEMU, SYSROOT = "aarch64-linux-gnu-gcc", "qemu-aarch64", "/usr/aarch64-linux-gnu"
# the kinds arch/arm/ has NEON dots of (16-bit), and 8-bit dots (sdot) of: every file layout's
# per-row dot8 and (issue 22 arm8) every repacked layout's grouped8 (Q4_0 .. Q6_K, then Q5_1 / Q5_K)
NEON_DOTS = {40, 4, 8, 50, 51, 104, 105, 106}
NEON_DOT8 = NEON_DOTS | {240, 204, 208, 250, 304, 306, 251, 305}


def test_aarch64_features_choose_the_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EXO_KERNEL_ISA", raising=False)
    n1, a72 = parse_arm_features(N1), parse_arm_features(A72)
    assert {"asimd", "asimddp"} <= n1 and "asimddp" not in a72
    assert runnable_isas(n1) == ("neon-dotprod", "portable")
    assert choose_isa(n1)[0] == "neon-dotprod"
    assert choose_isa(a72)[0] == "portable"
    assert hwcap_features(HWCAP_ASIMD | HWCAP_ASIMDDP | 1) == {"asimd", "asimddp"}
    assert runnable_isas(hwcap_features(HWCAP_ASIMD)) == ("portable",)


def test_exo_kernel_isa_forces_portable_on_arm(monkeypatch: pytest.MonkeyPatch) -> None:
    n1 = parse_arm_features(N1)
    monkeypatch.setenv("EXO_KERNEL_ISA", "portable")
    assert choose_isa(n1) == ("portable", "forced by EXO_KERNEL_ISA=portable")
    monkeypatch.setenv("EXO_KERNEL_ISA", "neon-dotprod")
    assert choose_isa(n1)[0] == "neon-dotprod"
    isa, why = choose_isa(parse_arm_features(A72))  # asked for, but the CPU lacks it
    assert isa == "portable" and "lacks asimd/asimddp" in why
    isa, why = choose_isa(frozenset({"avx2", "fma", "f16c"}))  # an x86 CPU
    assert isa == "avx2" and "lacks" in why


def test_x86_builds_keep_their_flags() -> None:
    """The aarch64 flags go to aarch64 targets only: an x86 build's flags (and so its cached
    library's name) are what they were."""
    assert target_flags("x86_64") == () and target_flags("aarch64") == ARM_FLAGS
    assert "-ffp-contract=off" not in library_flags("avx2", "x86_64")
    assert library_flags("portable", "aarch64")[-3:] == ("-ffp-contract=off", "-shared", "-fPIC")
    if platform.machine().lower() in ("x86_64", "amd64"):
        assert library_flags("avx2") == library_flags("avx2", "x86_64")
    assert ISA_FLAGS["neon-dotprod"] == ("-march=armv8.2-a+dotprod",)


def test_on_an_aarch64_machine_cpuinfo_picks_the_build_and_its_flags(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """What an aarch64 machine's load does (machine and cpuinfo stood in for): the Features line
    read, the build chosen and named, every aarch64 build compiled without contraction."""
    monkeypatch.delenv("EXO_KERNEL_ISA", raising=False)
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(A72, encoding="utf-8")
    assert arm_cpu_flags(cpuinfo) == {"fp", "asimd", "evtstrm", "crc32", "cpuid"}
    monkeypatch.setattr(kernel_build, "arm_cpu_flags", lambda: parse_arm_features(A72))
    assert choose_isa() == ("portable", "no dotprod (asimddp) on this CPU (aarch64)")
    monkeypatch.setattr(kernel_build, "arm_cpu_flags", lambda: parse_arm_features(N1))
    isa, why = choose_isa()
    assert isa == "neon-dotprod" and "asimd/asimddp" in why
    assert "-ffp-contract=off" in library_flags("portable")
    assert "-march=armv8.2-a+dotprod" in library_flags("neon-dotprod")
    # no cpuinfo to read: AT_HWCAP's bits (whatever this machine's are: names of the two bits only)
    assert arm_cpu_flags(tmp_path / "absent") <= {"asimd", "asimddp"}


# ---- cross-built, run under qemu ----


def _cross_tools() -> tuple[str, str]:
    cc, qemu = shutil.which(CROSS_CC), shutil.which(QEMU)
    if cc is None or qemu is None:
        missing = " and ".join(n for n, p in ((CROSS_CC, cc), (QEMU, qemu)) if p is None)
        pytest.skip(f"{missing} not installed (apt-get install gcc-aarch64-linux-gnu qemu-user)")
    if not Path(SYSROOT, "lib").is_dir():
        pytest.skip(f"no aarch64 libc under {SYSROOT} (apt-get install gcc-aarch64-linux-gnu)")
    return cc, qemu


@pytest.fixture(scope="module")
def harnesses(tmp_path_factory: pytest.TempPathFactory) -> dict[Isa, Path]:
    """Both aarch64 builds of the harness (UBSan), compiled at once."""
    cc, _ = _cross_tools()
    folder = tmp_path_factory.mktemp("arm")
    exes: dict[Isa, Path] = {isa: folder / f"harness-{isa}" for isa in ARM_BUILDS}
    with ThreadPoolExecutor(len(exes)) as pool:
        for done in [pool.submit(build_cross_harness, cc, i, e) for i, e in exes.items()]:
            done.result()
    return exes


def _qemu(exe: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1:exitcode=98"}
    return subprocess.run(
        [QEMU, "-cpu", "max", "-L", SYSROOT, str(exe), *args],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("isa", ARM_BUILDS)
def test_the_aarch64_builds_pass_the_harness_under_qemu(
    harnesses: dict[Isa, Path], isa: Isa
) -> None:
    """Every kind's 16-bit linear (random shapes, parts, groups) and every 8-bit kind's (file rows
    and their groups, the build's sdot kernels) against the references, the pool, attention and
    refusals: the harness's whole run, sized for qemu."""
    for seed in ("1", "2"):
        done = _qemu(harnesses[isa], seed, "16")
        report = f"seed {seed}:\n{done.stdout[-3000:]}\n{done.stderr[-4000:]}"
        assert done.returncode == 0, report
        assert f"isa {isa}," in done.stdout, report
        assert "passed: 0 failures" in done.stdout, report
        assert "runtime error" not in done.stderr, report


def _digest(run: subprocess.CompletedProcess[str]) -> list[str]:
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "digest done: 0 failed calls" in run.stdout, run.stdout[-2000:]
    return [line for line in run.stdout.splitlines() if line.startswith("digest kind")]


@pytest.mark.slow
def test_the_neon_build_gives_the_portable_results_bit_for_bit(
    harnesses: dict[Isa, Path], tmp_path: Path
) -> None:
    """Every kind and grouped layout, 16- and 8-bit activations, 1 to 64 rows (every strategy's
    threshold): the NEON + dotprod build's outputs hash as the portable build's, and as this
    machine's own portable build's where it is x86 (the same floats on both architectures); in the
    NEON build each of its own 8-bit entry points (every file layout's dot8, every group's
    grouped8) gives the generic entry point's bits on the same call (the digest's FAIL lines)."""
    neon_run, portable_run = (
        _qemu(harnesses["neon-dotprod"], "digest"),
        _qemu(harnesses["portable"], "digest"),
    )
    neon, portable = _digest(neon_run), _digest(portable_run)
    kinds = neon_run.stdout.count("entries kind ")
    assert kinds >= 14 and len(neon) == kinds * 2 * 8  # every kind, both widths, 8 row counts
    assert [a for a, b in zip(neon, portable, strict=True) if a != b] == []
    # the NEON build's own entry points ran where it has them (not the generic fallback)
    for kind in NEON_DOTS | NEON_DOT8:
        want = f"entries kind {kind}: dot {int(kind in NEON_DOTS)} dot8 {int(kind in NEON_DOT8)}"
        assert want in neon_run.stdout
        assert f"entries kind {kind}: dot 0 dot8 0" in portable_run.stdout
    host_cc = find_compiler()
    if host_cc is None or platform.machine().lower() not in ("x86_64", "amd64"):
        return
    native = tmp_path / "harness-x86-portable"
    build_harness(host_cc, "portable", native, sanitize=False)
    here = subprocess.run([str(native), "digest"], capture_output=True, text=True, timeout=120)
    assert _digest(here) == portable


@pytest.mark.slow
def test_the_aarch64_libraries_build(tmp_path: Path) -> None:
    """The shared libraries kernel_build makes on an aarch64 machine (warnings as errors)."""
    cc, _ = _cross_tools()
    with ThreadPoolExecutor(len(ARM_BUILDS)) as pool:
        jobs = [
            pool.submit(build_library, cc, isa, tmp_path / f"{isa}.so", "aarch64")
            for isa in ARM_BUILDS
        ]
        for job in jobs:
            job.result()
    assert all((tmp_path / f"{isa}.so").stat().st_size > 0 for isa in ARM_BUILDS)
