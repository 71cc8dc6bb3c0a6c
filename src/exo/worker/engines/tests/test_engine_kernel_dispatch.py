"""Run-time dispatch of the kernel builds (`kernel_build.choose_isa`): the best build the CPU
runs, EXO_KERNEL_ISA forcing a lower one, the load line naming it; and every x86 build giving
the AVX2 build's results bit for bit (the VNNI builds' `vpdpwssd` sums the same integers)."""

import pytest
import torch
from gguf import GGMLQuantizationType
from loguru import logger

from exo.modelgen.quants import random_blocks
from exo.worker.engines.cpu_kernels import PROLOGUE_RMS_NORM, QuantWeights, load_kernels_for
from exo.worker.engines.kernel_build import (
    AVXVNNI_EVEX_FLAGS,
    ISA_FLAGS,
    X86_ISAS,
    Isa,
    choose_isa,
    cpu_runs,
    isa_flags,
    runnable_isas,
)
from exo.worker.engines.kinds import KINDS

BASE = frozenset({"sse2", "avx", "avx2", "fma", "f16c"})
ZEN4 = BASE | {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"}  # (no AVX-VNNI: read off one)
ZEN5 = ZEN4 | {"avx_vnni"}
ALDER_LAKE = BASE | {"avx_vnni"}


def test_the_best_build_the_cpu_runs_is_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EXO_KERNEL_ISA", raising=False)
    assert choose_isa(ZEN4)[0] == "avx512vnni" and choose_isa(ZEN5)[0] == "avx512vnni"
    assert choose_isa(ALDER_LAKE)[0] == "avxvnni"
    assert choose_isa(BASE)[0] == "avx2"
    assert choose_isa(BASE - {"fma"})[0] == "portable"
    # AVX-512 without VNNI (Skylake-X) is no VNNI build
    assert choose_isa(BASE | {"avx512f", "avx512bw", "avx512vl"})[0] == "avx2"
    assert runnable_isas(ALDER_LAKE) == ("avxvnni", "avx2", "portable")


def test_the_avxvnni_build_runs_in_evex_encodings_where_only_avx512_vnni_is() -> None:
    """A CPU with AVX-512 VNNI and no AVX-VNNI runs the avxvnni build's code, its two VNNI
    instructions in their AVX-512 VL forms: so that build is tested there too."""
    assert runnable_isas(ZEN4) == ("avx512vnni", "avxvnni", "avx2", "portable")
    assert isa_flags("avxvnni", ZEN4) == AVXVNNI_EVEX_FLAGS
    assert isa_flags("avxvnni", ZEN5) == isa_flags("avxvnni", ALDER_LAKE) == ISA_FLAGS["avxvnni"]
    assert isa_flags("avx512vnni", ZEN4) == ISA_FLAGS["avx512vnni"]
    # AVX-512 without VNNI runs neither VNNI build
    assert runnable_isas(BASE | {"avx512f", "avx512bw", "avx512vl"}) == ("avx2", "portable")


@pytest.mark.parametrize("forced", ["portable", "avx2", "avxvnni", "avx512vnni"])
def test_exo_kernel_isa_forces_any_lower_build(
    monkeypatch: pytest.MonkeyPatch, forced: str
) -> None:
    monkeypatch.setenv("EXO_KERNEL_ISA", forced)
    isa, why = choose_isa(ZEN4)
    assert isa == forced and f"EXO_KERNEL_ISA={forced}" in why


def test_a_build_the_cpu_cannot_run_is_not_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXO_KERNEL_ISA", "avx512vnni")
    isa, why = choose_isa(ALDER_LAKE)
    assert isa == "avxvnni" and "lacks" in why and "avx512_vnni" in why
    monkeypatch.setenv("EXO_KERNEL_ISA", "sse9")
    assert choose_isa(BASE)[0] == "avx2"


def _x86_builds() -> list[Isa]:
    return [i for i in X86_ISAS if i != "avx2"]


@pytest.mark.parametrize("isa", _x86_builds())
def test_each_x86_build_gives_the_avx2_results_bit_for_bit(isa: Isa) -> None:
    """Every kind, file rows and 8-row groups, at 1 to 64 activation rows: the VNNI builds sum
    the same integers in the same order as the AVX2 build."""
    if not cpu_runs(isa):
        pytest.skip(f"this CPU cannot run the {isa} build")
    ours, avx2 = load_kernels_for(isa), load_kernels_for("avx2")
    if ours is None or avx2 is None:
        pytest.skip("the kernels did not build here (see the log)")
    messages: list[str] = []
    sink = logger.add(messages.append, format="{message}")
    try:
        load_kernels_for(isa, why="named")
    finally:
        logger.remove(sink)
    assert any(f"the {isa} path" in m for m in messages)  # the load line names the build
    k = 512
    torch.manual_seed(0)
    gain = torch.rand(k) + 0.5
    for kind in KINDS:
        raw = torch.from_numpy(random_blocks(GGMLQuantizationType(kind.ggml), 40, k, seed=3))
        layouts = [(kind.kernel, raw)]
        if kind.grouped is not None:
            grouped = torch.empty_like(raw)
            avx2.repack_rows(kind.kernel, raw, grouped)
            layouts.append((kind.grouped, grouped))
        for kernel, rows in layouts:
            w = QuantWeights(kind.kernel, PROLOGUE_RMS_NORM, [rows], gain, 1e-5, None, k, [kernel])
            for m in (1, 2, 4, 8, 9, 64):
                x = torch.randn(m, k)
                assert torch.equal(ours.linear(w, x), avx2.linear(w, x)), (kind.name, kernel, m)
