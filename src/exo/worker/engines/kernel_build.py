"""Building the C kernels (`csrc/`): which instruction set, which compiler, which flags.

The same sources build one library per instruction set (see `csrc/exo_kernels.h`, `csrc/kinds.h`):
`avx2` (the generic files plus `csrc/arch/x86/`, AVX2 + FMA + F16C intrinsics); `avxvnni` and
`avx512vnni` (the same x86 code built for AVX-VNNI, or for AVX-512 F/BW/VL + VNNI: its int16
multiply-adds become `vpdpwssd`, and the compiler may use the wider registers in the generic
loops); and `portable` (the generic files alone: plain C loops the compiler vectorises for the
machine it targets, old x86, ARM without dotprod; an ISA folder's files compile to nothing in
other builds); on aarch64 also `neon-dotprod` (the generic files plus `csrc/arch/arm/`: the
aarch64 part at the end of this file). At run time the best build the CPU can run is chosen (`choose_isa`);
`EXO_KERNEL_ISA` forces a lower one. Every `.c` under
`csrc/` but the harness's is compiled, and every source and header keys the cached build.
Builds use warnings as errors; a failed build's compiler output goes to the log. The standalone
test harness (`csrc/harness/`) builds from the same sources with AddressSanitizer and
UndefinedBehaviorSanitizer.
"""

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path
from typing import Literal

from loguru import logger

Isa = Literal["avx512vnni", "avxvnni", "avx2", "neon-dotprod", "portable"]
ISAS: tuple[Isa, ...] = ("avx512vnni", "avxvnni", "avx2", "neon-dotprod", "portable")  # best first
X86_ISAS: tuple[Isa, ...] = ("avx512vnni", "avxvnni", "avx2")  # the builds with arch/x86/
HARNESS_SOURCES = (
    "harness/harness.c",
    "harness/reference.c",
    "harness/act8_check.c",
    "harness/digest.c",  # arm: the digest mode (builds compared bit for bit)
    "harness/iq4_reference.c",  # MXFP4, IQ4_NL, IQ4_XS
    "harness/attend_sinks_check.c",  # issue 23 sinks: gpt-oss's sinks and sliding window
)
HARNESS_HEADERS = ("harness/reference.h",)
WARNINGS = ("-Wall", "-Wextra", "-Werror")
COMMON_FLAGS = ("-O3", "-std=gnu11", "-pthread", *WARNINGS)
ISA_FLAGS: dict[Isa, tuple[str, ...]] = {
    "avx512vnni": (
        "-mavx2",
        "-mfma",
        "-mf16c",
        "-mavx512f",
        "-mavx512bw",
        "-mavx512vl",
        "-mavx512vnni",
    ),
    "avxvnni": ("-mavx2", "-mfma", "-mf16c", "-mavxvnni"),
    "avx2": ("-mavx2", "-mfma", "-mf16c"),
    "portable": ("-DEXO_FORCE_PORTABLE",),
    "neon-dotprod": ("-march=armv8.2-a+dotprod",),  # arm: baseline NEON + sdot (arch/arm/)
}
# The avxvnni build for a CPU with AVX-512 VNNI but not AVX-VNNI (Zen 4, Cascade Lake, Ice Lake):
# the same code, its two VNNI instructions in their EVEX (AVX-512 VL) forms (csrc/exo_kernels.h),
# so that where such a CPU runs the tests, the avxvnni build's code runs too.
AVXVNNI_EVEX_FLAGS = ("-mavx2", "-mfma", "-mf16c", "-mavx512vl", "-mavx512vnni", "-DEXO_AVXVNNI_EVEX")
SANITIZE_FLAGS = (
    "-O1",
    "-g",
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
    "-fno-omit-frame-pointer",
)
# what /proc/cpuinfo must list for each build to run (avxvnni: or _AVXVNNI_EVEX_CPU)
_CPU_FLAGS: dict[Isa, tuple[str, ...]] = {
    "avx512vnni": ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"),
    "avxvnni": ("avx2", "fma", "f16c", "avx_vnni"),
    "avx2": ("avx2", "fma", "f16c"),
    "portable": (),
    "neon-dotprod": ("asimd", "asimddp"),  # arm: /proc/cpuinfo's Features (or AT_HWCAP's bits)
}
_AVXVNNI_EVEX_CPU = ("avx2", "fma", "f16c", "avx512f", "avx512vl", "avx512_vnni")


class KernelBuildError(RuntimeError):
    """The compiler rejected the sources (its output is the message)."""


def csrc_dir() -> Path:
    return Path(str(resources.files("exo.worker.engines") / "csrc"))


def source_text(names: tuple[str, ...]) -> str:
    return "\0".join(f"{n}\0{(csrc_dir() / n).read_text(encoding='utf-8')}" for n in names)


def _kernel_files(suffix: str) -> tuple[str, ...]:
    """Paths (relative to csrc/, sorted) of the kernels' files ending in `suffix`: the generic
    ones and every arch/ folder's (an ISA's files compile to nothing in other ISAs' builds)."""
    root = csrc_dir()
    found = (p.relative_to(root).as_posix() for p in root.rglob(f"*{suffix}"))
    return tuple(sorted(n for n in found if not n.startswith("harness/")))


def kernel_sources() -> tuple[str, ...]:
    return _kernel_files(".c")


def find_compiler() -> str | None:
    """$CC if set (None if it is not there), else cc, gcc or clang on the PATH."""
    chosen = os.environ.get("CC", "").strip()
    if chosen:
        return shutil.which(chosen.split()[0])
    return shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (/proc/cpuinfo; aarch64: `arm_cpu_flags`; empty elsewhere)."""
    if is_arm():
        return arm_cpu_flags()
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return frozenset()
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    flags_line = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "")
    return frozenset(flags_line.split(":", 1)[-1].split())


def cpu_runs(isa: Isa, flags: frozenset[str] | None = None) -> bool:
    """Whether this CPU (or one with `flags`) runs the `isa` build."""
    have = cpu_flags() if flags is None else flags
    return all(f in have for f in _CPU_FLAGS[isa]) or (
        isa == "avxvnni" and all(f in have for f in _AVXVNNI_EVEX_CPU)
    )


def isa_flags(isa: Isa, flags: frozenset[str] | None = None) -> tuple[str, ...]:
    """The compiler flags of the `isa` build for this CPU (or one with `flags`): ISA_FLAGS's,
    but the avxvnni build's EVEX form (AVXVNNI_EVEX_FLAGS) where only that runs."""
    if isa != "avxvnni":
        return ISA_FLAGS[isa]
    have = cpu_flags() if flags is None else flags
    if all(f in have for f in _CPU_FLAGS[isa]) or not cpu_runs(isa, have):
        return ISA_FLAGS[isa]
    return AVXVNNI_EVEX_FLAGS


def cpu_has_avx2() -> bool:
    return cpu_runs("avx2")


def runnable_isas(flags: frozenset[str] | None = None) -> tuple[Isa, ...]:
    """The builds this CPU runs, best first (portable always)."""
    have = cpu_flags() if flags is None else flags
    return tuple(i for i in ISAS if cpu_runs(i, have))


def choose_isa(flags: frozenset[str] | None = None) -> tuple[Isa, str]:
    """The instruction set to build for, and why (for the log): the best the CPU runs, or a
    lower one forced by EXO_KERNEL_ISA=portable|avx2|avxvnni|avx512vnni (one the CPU cannot run
    gives the best it can, saying so)."""
    forced = os.environ.get("EXO_KERNEL_ISA", "").strip().lower()
    runnable = runnable_isas(flags)
    best = runnable[0]
    if forced in ISAS:
        if forced in runnable:
            return forced, f"forced by EXO_KERNEL_ISA={forced}"
        return (
            best,
            f"EXO_KERNEL_ISA={forced} asked, but this CPU lacks {'/'.join(_CPU_FLAGS[forced])}",
        )
    if forced not in ("", "auto"):
        logger.warning(
            f"EXO_KERNEL_ISA={forced!r} is not one of auto, {', '.join(ISAS)}: using auto"
        )
    if best == "portable":
        lacks = "dotprod (asimddp)" if is_arm() else "AVX2"
        return best, f"no {lacks} on this CPU ({platform.machine()})"
    return best, f"the best this CPU runs ({'/'.join(_CPU_FLAGS[best])})"


def library_flags(isa: Isa, machine: str | None = None) -> tuple[str, ...]:
    """For this machine, or the target `machine` (a cross build)."""
    native = ISA_FLAGS[isa] if machine is not None else isa_flags(isa)
    return (*COMMON_FLAGS, *native, *target_flags(machine), "-shared", "-fPIC")


def library_name(compiler: str, isa: Isa) -> str:
    # every source and header of csrc/ but the harness's, with its path (a new file, or a file
    # moved between folders, cannot be left out of the key)
    text = source_text(kernel_sources() + _kernel_files(".h"))
    key = hashlib.sha256("\0".join([text, compiler, *library_flags(isa)]).encode()).hexdigest()
    return f"exo_kernels_{isa}_{key[:16]}.so"


def run_compiler(args: list[str], out: Path) -> None:
    """Run the compiler; write `out` atomically (concurrent runners never load half a file)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        built = Path(tmp) / out.name
        try:
            done = subprocess.run(
                [*args, "-o", str(built), "-lm"], capture_output=True, text=True, timeout=300
            )
        except (OSError, subprocess.SubprocessError) as e:
            raise KernelBuildError(f"{args[0]} could not run: {e}") from e
        if done.returncode != 0:
            raise KernelBuildError(
                f"{' '.join(args)} exited with {done.returncode}:\n{done.stderr.strip()}"
            )
        built.replace(out)


def build_library(compiler: str, isa: Isa, out: Path, machine: str | None = None) -> None:
    src = csrc_dir()
    files = [str(src / n) for n in kernel_sources()]
    run_compiler([compiler, *library_flags(isa, machine), f"-I{src}", *files], out)


def build_harness(compiler: str, isa: Isa, out: Path, *, sanitize: bool = True) -> None:
    """The standalone C test harness (no Python in its process) over the kernel sources."""
    src = csrc_dir()
    flags = [*COMMON_FLAGS, *isa_flags(isa), *target_flags(), *(SANITIZE_FLAGS if sanitize else ())]
    files = [str(src / n) for n in kernel_sources() + HARNESS_SOURCES]
    run_compiler([compiler, *flags, f"-I{src}", *files], out)


# ---- aarch64 (arm) ----
# The aarch64 builds: `portable` and `neon-dotprod` (arch/arm/: NEON dots of the 16-bit
# activations, baseline armv8-a, and sdot dots of the 8-bit ones, armv8.2-a+dotprod: every file
# layout's per-row dot8 and every repacked layout's grouped8, issue 22 arm8). Every
# aarch64 build contracts no multiply-adds (FMA is baseline there: the compiler would fuse the
# generic files' `a * b + c` where it liked), so both builds give the x86 portable build's floats
# bit for bit (the harness's digest mode checks it under qemu: tests/test_engine_kernel_arm.py).
# Their speed has not been measured: no ARM machine was at hand, only qemu.
ARM_ISAS: tuple[Isa, ...] = ("neon-dotprod",)  # the builds with arch/arm/
ARM_MACHINES = ("aarch64", "arm64")
ARM_FLAGS = ("-ffp-contract=off",)
HWCAP_ASIMD, HWCAP_ASIMDDP = 1 << 1, 1 << 20  # AT_HWCAP bits (Linux, arm64)
_AT_HWCAP = 16
# the cross build run under qemu: UBSan only (ASan is unreliable under qemu-user)
CROSS_SANITIZE_FLAGS = ("-fsanitize=undefined", "-fno-sanitize-recover=all")  # at -O3: as shipped


def is_arm(machine: str | None = None) -> bool:
    return (machine or platform.machine()).lower() in ARM_MACHINES


def target_flags(machine: str | None = None) -> tuple[str, ...]:
    """The flags every build for this machine (or `machine`) adds: ARM_FLAGS on aarch64."""
    return ARM_FLAGS if is_arm(machine) else ()


def parse_arm_features(cpuinfo: str) -> frozenset[str]:
    """The `Features` line of an aarch64 /proc/cpuinfo (asimd, asimddp, ...)."""
    line = next((li for li in cpuinfo.splitlines() if li.startswith("Features")), "")
    return frozenset(line.split(":", 1)[-1].split())


def hwcap_features(hwcap: int) -> frozenset[str]:
    """The feature names of the AT_HWCAP bits the aarch64 builds ask for."""
    bits = {"asimd": HWCAP_ASIMD, "asimddp": HWCAP_ASIMDDP}
    return frozenset(name for name, bit in bits.items() if hwcap & bit)


def arm_cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """/proc/cpuinfo's Features, or where that cannot be read, getauxval(AT_HWCAP)'s bits."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
        found = parse_arm_features(text)
        if found:
            return found
    except OSError:
        pass
    try:
        getauxval = ctypes.CDLL(None).getauxval
        getauxval.restype, getauxval.argtypes = ctypes.c_ulong, [ctypes.c_ulong]
        return hwcap_features(int(getauxval(_AT_HWCAP)))
    except (OSError, AttributeError):
        return frozenset()


def cross_harness_flags(isa: Isa) -> tuple[str, ...]:
    """The flags of the aarch64 harness cross-built for `isa` (run under qemu-aarch64)."""
    return (*COMMON_FLAGS, *ISA_FLAGS[isa], *ARM_FLAGS, *CROSS_SANITIZE_FLAGS)


def build_cross_harness(compiler: str, isa: Isa, out: Path) -> None:
    """The harness for aarch64 (`compiler`: aarch64-linux-gnu-gcc), UBSan, linked dynamically
    (run it with `qemu-aarch64 -L /usr/aarch64-linux-gnu`)."""
    src = csrc_dir()
    files = [str(src / n) for n in kernel_sources() + HARNESS_SOURCES]
    run_compiler([compiler, *cross_harness_flags(isa), f"-I{src}", *files], out)
