"""The ctypes boundary of the CPU kernels: every wrapper refuses what C cannot take (dtype,
device, shape), copies what is not contiguous and keeps those copies alive through the call;
a failed build says why in the log; the portable C path gives the same answers."""

import ctypes
import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from loguru import logger

from exo.worker.engines import cpu_kernels
from exo.worker.engines.cpu_kernels import (
    PROLOGUE_NONE,
    PROLOGUE_RMS_NORM,
    PROLOGUE_SWIGLU,
    KernelArgumentError,
    QKernels,
    QuantWeights,
    kernels_unavailable_reason,
    load_kernels,
)
from exo.worker.engines.kv_cache import KVCache, PagedLayer
from exo.worker.engines.linear import dequantize_blocks, quantize_q4


@pytest.fixture(scope="module")
def kernels() -> QKernels:
    k = load_kernels()
    if k is None:
        pytest.skip(kernels_unavailable_reason() or "the CPU kernels did not build (see the log)")
    return k


def _q4(w: torch.Tensor) -> torch.Tensor:
    """q4 blocks as the 2-D rows of bytes the kernel reads."""
    return quantize_q4(w).reshape(w.shape[0], -1)


def _weights(n: int = 64, k: int = 96, prologue: int = PROLOGUE_NONE) -> QuantWeights:
    torch.manual_seed(0)
    gain = torch.rand(k) + 0.5 if prologue == PROLOGUE_RMS_NORM else None
    return QuantWeights(4, prologue, [_q4(torch.randn(n, k))], gain, 1e-5, None, k)


# ---- linear ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("x", "residual", "message"),
    [
        (torch.randn(2, 96, dtype=torch.float64), None, "x must be float32"),
        (torch.randn(2, 96).half(), None, "x must be float32"),
        (torch.randn(2, 95), None, r"x must be \[..., 96\]"),
        (torch.randn(2, 192), None, r"x must be \[..., 96\]"),
        (torch.randn(2, 96), torch.randn(2, 63), r"residual must have shape \[2, 64\]"),
        (torch.randn(2, 96), torch.randn(3, 64), r"residual must have shape \[2, 64\]"),
        (torch.randn(2, 96), torch.randn(2, 1, 64), r"residual must have shape \[2, 64\]"),
        (torch.randn(2, 96), torch.tensor(1.0), r"residual must have shape \[2, 64\]"),
        (torch.tensor(1.0), None, r"x must be \[..., 96\]"),
        (torch.randn(2, 96), torch.randn(2, 64, dtype=torch.float64), "residual must be float32"),
    ],
)
def test_linear_refuses_what_the_kernel_cannot_take(
    kernels: QKernels, x: torch.Tensor, residual: torch.Tensor | None, message: str
) -> None:
    with pytest.raises(KernelArgumentError, match=message):
        kernels.linear(_weights(), x, residual)


def test_linear_refuses_a_tensor_on_another_device(kernels: QKernels) -> None:
    x = torch.randn(2, 96, device="meta")
    with pytest.raises(KernelArgumentError, match="must be on the CPU"):
        kernels.linear(_weights(), x)


def test_swiglu_takes_twice_the_width(kernels: QKernels) -> None:
    w = _weights(prologue=PROLOGUE_SWIGLU)
    with pytest.raises(KernelArgumentError, match=r"x must be \[..., 192\]"):
        kernels.linear(w, torch.randn(2, 96))
    assert kernels.linear(w, torch.randn(2, 192)).shape == (2, 64)


BAD_WEIGHTS: list[tuple[Callable[[torch.Tensor], object], str]] = [
    (lambda p: QuantWeights(4, 0, [p.to(torch.int8)], None, 1e-5, None, 96), "uint8"),
    (lambda p: QuantWeights(4, 0, [p[:, :-1]], None, 1e-5, None, 96), "rows of 60 bytes"),
    (lambda p: QuantWeights(4, 0, [p.flatten()], None, 1e-5, None, 96), "2-D uint8"),
    (lambda p: QuantWeights(4, 0, [p], None, 1e-5, None, 80), "multiple of 32"),
    (lambda p: QuantWeights(104, 0, [p], None, 1e-5, None, 96), "multiple of 256"),
    (lambda p: QuantWeights(5, 0, [p], None, 1e-5, None, 96), "unknown weight layout"),
    (lambda p: QuantWeights(4, 7, [p], None, 1e-5, None, 96), "unknown prologue"),
    (lambda p: QuantWeights(4, 1, [p], None, 1e-5, None, 96), "needs a gain"),
    (lambda p: QuantWeights(4, 1, [p], torch.ones(95), 1e-5, None, 96), r"gain must have"),
    (lambda p: QuantWeights(4, 0, [p], None, 1e-5, torch.ones(3), 96), r"bias must have"),
    (lambda p: QuantWeights(4, 0, [p] * 5, None, 1e-5, None, 96), "1 to 4 parts"),
]


@pytest.mark.parametrize(("make", "message"), BAD_WEIGHTS)
def test_weights_refuse_bad_layouts(make: Callable[[torch.Tensor], object], message: str) -> None:
    part = _q4(torch.randn(8, 96))
    with pytest.raises(KernelArgumentError, match=message):
        make(part)


def test_non_contiguous_inputs_give_the_contiguous_answer(kernels: QKernels) -> None:
    w = _weights()
    x = torch.randn(96, 5).t()  # [5, 96], not contiguous
    residual = torch.randn(64, 5).t()
    assert not x.is_contiguous() and not residual.is_contiguous()
    want = kernels.linear(w, x.contiguous(), residual.contiguous())
    assert torch.equal(kernels.linear(w, x, residual), want)


class _SpyLinear:
    """Stands in for the C function: reads the residual where the pointer says, after the
    allocator has had every chance to hand the memory of a freed temporary to someone else."""

    argtypes: list[Any]
    restype: Any

    def __init__(self, n_values: int) -> None:
        self.n_values = n_values
        self.seen: list[float] = []

    def __call__(self, spec: int, x: int, rows: int, residual: int, y: int) -> int:
        for _ in range(8):  # same-sized allocations, overwritten: reuse a freed block
            torch.full((self.n_values,), -7.0).add_(0)
        self.seen = list(
            (ctypes.c_float * self.n_values).from_address(residual)  # pyright: ignore[reportUnknownArgumentType]
        )
        return 0


class _FakeLib:
    def __init__(self, linear: _SpyLinear) -> None:
        self.exo_qlinear = linear
        self.exo_set_threads = _SpyLinear(0)
        self.exo_set_spin = _SpyLinear(0)
        self.exo_attend_step = _SpyLinear(0)
        self.exo_repack_rows = _SpyLinear(0)
        self.exo_unrepack_rows = _SpyLinear(0)
        self.exo_dequant_rows = _SpyLinear(0)
        self.exo_set_activations = _SpyLinear(16)


def test_a_contiguous_copy_lives_until_the_kernel_returns() -> None:
    """The old wrapper passed `residual.contiguous().data_ptr()`: the copy was freed before the
    call, and the kernel read whatever the allocator put there next."""
    w = _weights()
    rows = 32
    residual = torch.arange(64 * rows, dtype=torch.float32).reshape(64, rows).t()  # [rows, 64]
    spy = _SpyLinear(rows * 64)
    lib: Any = _FakeLib(spy)
    wrapped = QKernels(lib, "portable")
    wrapped.linear(w, torch.randn(rows, 96), residual)
    assert spy.seen == residual.contiguous().flatten().tolist()


# ---- attention -------------------------------------------------------------------------------

H, KV, HD = 4, 2, 16


@pytest.fixture
def step() -> Iterator[tuple[torch.Tensor, torch.Tensor, PagedLayer, torch.Tensor]]:
    cache = KVCache(1, 1, 128, KV, HD, dtype=torch.float32, device=torch.device("cpu"))
    cache.prepare((0,), (0,), 1)
    angles = torch.outer(torch.arange(128.0), torch.rand(HD // 2))
    rope = torch.polar(torch.ones_like(angles), angles)
    yield torch.randn(1, 1, (H + 2 * KV) * HD), rope, cache.layer(0).paged(), torch.tensor([0])


def test_attention_runs_on_good_arguments(
    kernels: QKernels, step: tuple[torch.Tensor, torch.Tensor, PagedLayer, torch.Tensor]
) -> None:
    qkv, rope, paged, pos = step
    assert kernels.attend_decode(qkv, H, KV, HD, rope, None, 1e-5, paged, pos).shape == (1, 1, 64)


def _with(p: PagedLayer, **changes: Any) -> PagedLayer:
    return dataclasses.replace(p, **changes)


Args = dict[str, Any]
BAD_ATTENTION: list[tuple[Callable[[Args], Args], str]] = [
    (lambda a: {**a, "qkv": a["qkv"].double()}, "qkv must be float32"),
    (lambda a: {**a, "qkv": a["qkv"][..., :-1]}, "qkv must have shape"),
    (lambda a: {**a, "qkv": a["qkv"][0]}, r"qkv must be \[B, 1, W\]"),
    (lambda a: {**a, "heads": 3}, "multiple of kv_heads"),
    (lambda a: {**a, "head_dim": 15}, "head_dim even"),
    (lambda a: {**a, "rope": a["rope"].real.contiguous()}, "rope must be complex64"),
    (lambda a: {**a, "rope": a["rope"][:, :4]}, r"rope must be \[P, 8\]"),
    (lambda a: {**a, "rope": a["rope"][:0]}, "past the rope table"),
    (lambda a: {**a, "positions": torch.tensor([0], dtype=torch.int32)}, "int64"),
    (lambda a: {**a, "positions": torch.tensor([0, 0])}, "positions must have shape"),
    (lambda a: {**a, "positions": torch.tensor([-1])}, "must not be negative"),
    (lambda a: {**a, "positions": torch.tensor([64])}, "past the rope table or the row"),
    (lambda a: {**a, "qk_norm": torch.ones(H, HD)}, "qk_norm must have shape"),
    (lambda a: {**a, "cache": _with(a["cache"], kv_heads=1)}, "the cache holds 1 kv heads"),
    (lambda a: {**a, "cache": _with(a["cache"], dtype=torch.bfloat16)}, "must be float32"),
    (lambda a: {**a, "cache": _with(a["cache"], pages=a["cache"].pages.int())}, "int64"),
]


@pytest.mark.parametrize(("change", "message"), BAD_ATTENTION)
def test_attention_refuses_what_the_kernel_cannot_take(
    kernels: QKernels,
    step: tuple[torch.Tensor, torch.Tensor, PagedLayer, torch.Tensor],
    change: Callable[[dict[str, Any]], dict[str, Any]],
    message: str,
) -> None:
    qkv, rope, paged, pos = step
    args: dict[str, Any] = {
        "qkv": qkv, "heads": H, "kv_heads": KV, "head_dim": HD, "rope": rope,
        "qk_norm": None, "eps": 1e-5, "cache": paged, "positions": pos,
    }  # fmt: skip
    with pytest.raises(KernelArgumentError, match=message):
        kernels.attend_decode(**change(args))


# ---- building --------------------------------------------------------------------------------


def test_a_failed_build_logs_the_compiler_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "fake-cc"
    fake.write_text("#!/bin/sh\necho 'linear.c:1:1: error: the compiler says no' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    messages: list[str] = []
    sink = logger.add(lambda m: messages.append(str(m)), level="INFO")
    try:
        assert cpu_kernels.load_kernels.__wrapped__(tmp_path / "kernels") is None
    finally:
        logger.remove(sink)
    text = "".join(messages)
    assert "CPU kernels off" in text and "the compiler says no" in text, text


def test_without_a_compiler_the_reason_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "/nonexistent/cc")
    assert kernels_unavailable_reason() == (
        "no C compiler (cc, gcc or clang; or $CC) to build the CPU kernels"
    )


def test_the_portable_path_matches_avx2(
    kernels: QKernels, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXO_KERNEL_ISA", "portable")
    portable = cpu_kernels.load_kernels.__wrapped__(tmp_path / "portable")
    assert portable is not None and portable.isa == "portable"
    torch.manual_seed(1)
    w_dense = torch.randn(80, 256) * 0.1
    w = QuantWeights(4, PROLOGUE_NONE, [_q4(w_dense)], None, 1e-5, None, 256)
    x = torch.randn(5, 256)
    want = x @ dequantize_blocks(quantize_q4(w_dense), 4).t()
    torch.testing.assert_close(portable.linear(w, x), want, atol=2e-3, rtol=1e-3)
    torch.testing.assert_close(portable.linear(w, x), kernels.linear(w, x), atol=1e-4, rtol=1e-4)


def test_thread_counts_below_one_are_refused(kernels: QKernels) -> None:
    with pytest.raises(KernelArgumentError, match="at least 1"):
        kernels.set_threads(0)


def test_a_pool_that_sleeps_at_once_gives_the_same_answers(
    kernels: QKernels, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EXO_KERNEL_SPIN_US=0: the pool never spins (the A/B switch for benchmarks)."""
    monkeypatch.setenv("EXO_KERNEL_SPIN_US", "0")
    messages: list[str] = []
    sink = logger.add(lambda m: messages.append(str(m)), level="INFO")
    try:
        sleepy = cpu_kernels.load_kernels.__wrapped__(tmp_path / "k")
    finally:
        logger.remove(sink)
    assert sleepy is not None and "spin 0/0 us" in "".join(messages)
    w, x = _weights(n=3072, k=576), torch.randn(3, 576)
    want = kernels.linear(w, x)
    sleepy.set_threads(2)
    try:
        for _ in range(20):
            assert torch.equal(sleepy.linear(w, x), want)
    finally:
        sleepy.set_threads(1)
        sleepy.set_spin(50, 100)
