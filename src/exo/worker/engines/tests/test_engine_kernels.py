"""The compiled CPU kernels against plain torch on the same (dequantised) weights."""

import os
import signal
import time

import pytest
import torch
import torch.nn.functional as F

from exo.worker.engines.cpu_kernels import QKernels
from exo.worker.engines.kv_cache import KVCache, LayerCache
from exo.worker.engines.linear import (
    GeGLU,
    PostNormLinear,
    QuantLinear,
    RmsNorm,
    SwiGLU,
    WeightFormat,
    dequantize_blocks,
    make_linear,
    quantize_q4,
    quantize_q8,
)
from exo.worker.engines.rope import rope_table
from exo.worker.engines.weights import ShardWeights


@pytest.fixture(scope="module")
def kernels(isa_kernels: QKernels) -> QKernels:
    """Each instruction-set path this machine can run (the portable one everywhere)."""
    return isa_kernels


def test_requantising_gguf_blocks_is_exact(full_weights: ShardWeights) -> None:
    w = full_weights.layers[3].w_gate  # Q4_1 in the file
    assert isinstance(w, torch.Tensor)  # the dense plan: dequantised
    assert torch.equal(dequantize_blocks(quantize_q4(w), 4), w)
    e = full_weights.embed  # Q8_0 in the file
    assert isinstance(e, torch.Tensor)
    assert torch.equal(dequantize_blocks(quantize_q8(e[:512]), 8), e[:512])


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("rows", [1, 6])
def test_quantised_linear_matches_torch(kernels: QKernels, bits: int, rows: int) -> None:
    torch.manual_seed(bits * 10 + rows)
    n, k = 160, 96
    w, bias, gain = torch.randn(n, k) * 0.1, torch.randn(n), torch.rand(k) + 0.5
    x, residual = torch.randn(rows, k) * 4, torch.randn(rows, n)
    dense = dequantize_blocks(quantize_q4(w) if bits == 4 else quantize_q8(w), bits)
    fmt = "q4" if bits == 4 else "q8"
    lin = make_linear(w, bias, fmt, prologue=RmsNorm(gain, 1e-5), kernels=kernels)
    want = F.linear(F.rms_norm(x, (k,), gain, 1e-5), dense, bias) + residual
    torch.testing.assert_close(lin(x, residual=residual), want, atol=2e-3, rtol=1e-3)
    x2 = torch.randn(rows, 2 * k)
    swiglu = make_linear(w, None, fmt, prologue=SwiGLU(), kernels=kernels)
    want = F.linear(F.silu(x2[:, :k]) * x2[:, k:], dense)
    torch.testing.assert_close(swiglu(x2), want, atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize("fmt", ["q4", "q8", "dense"])
@pytest.mark.parametrize("rows", [1, 6])
def test_geglu_prologue_and_post_norm_match_torch(
    kernels: QKernels, fmt: WeightFormat, rows: int
) -> None:
    """Gemma 3's MLP end: y = h + rmsnorm(gelu_tanh(a) * b Wd^T) * g_post, fused in the kernel
    (q4 / q8) or in torch around the layer (dense)."""
    torch.manual_seed(rows)
    n, k = 160, 96
    w, bias, post = torch.randn(n, k) * 0.1, torch.randn(n), torch.rand(n) + 0.5
    x, residual = torch.randn(rows, 2 * k) * 2, torch.randn(rows, n)
    dense = w
    if fmt != "dense":
        bits = 4 if fmt == "q4" else 8
        dense = dequantize_blocks(quantize_q4(w) if bits == 4 else quantize_q8(w), bits)
    lin = make_linear(
        w, bias, fmt, prologue=GeGLU(), kernels=kernels, post_norm=RmsNorm(post, 1e-6)
    )
    assert isinstance(lin, PostNormLinear if fmt == "dense" else QuantLinear)
    t = F.linear(F.gelu(x[:, :k], approximate="tanh") * x[:, k:], dense, bias)
    want = residual + F.rms_norm(t, (n,), post, 1e-6)
    torch.testing.assert_close(lin(x, residual=residual), want, atol=2e-3, rtol=1e-3)


def _reference_attention(
    qkv: torch.Tensor, rope: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: list[int]
) -> torch.Tensor:
    """torch: rotate q, k (complex), append k, v at pos, attend over 0..pos. -> [B, 1, H*hd]."""
    heads, kv, hd = 9, 3, 64
    outs = []
    for b, p in enumerate(pos):
        q_k_v = qkv[b, 0].unflatten(-1, (-1, hd))  # [H + 2KV, hd]
        qk = torch.view_as_real(
            torch.view_as_complex(q_k_v[: heads + kv].unflatten(-1, (-1, 2))) * rope[p]
        )
        qk = qk.flatten(-2)
        k[b, :, p], v[b, :, p] = qk[heads:], q_k_v[heads + kv :]
        q = qk[:heads].unsqueeze(1)  # [H, 1, hd]
        o = F.scaled_dot_product_attention(q, k[b, :, : p + 1], v[b, :, : p + 1], enable_gqa=True)
        outs.append(o.reshape(1, heads * hd))
    return torch.stack(outs)


def _random_rope(max_seq: int, hd: int) -> torch.Tensor:
    """A rotation table of random frequencies: complex64 [max_seq, hd/2]."""
    return rope_table(max_seq, torch.rand(hd // 2, dtype=torch.float64), torch.device("cpu"))


def _attend_on(
    kernels: QKernels,
    threads: int,
    qkv: torch.Tensor,
    shape: tuple[int, int, int],
    rope: torch.Tensor,
    qk_norm: torch.Tensor | None,
    layer: LayerCache,
    pos: list[int],
) -> torch.Tensor:
    """The decode attention kernel at `threads` threads (then one again)."""
    heads, kv, hd = shape
    kernels.set_threads(threads)
    try:
        return kernels.attend_decode(
            qkv, heads, kv, hd, rope, qk_norm, 1e-5, layer.paged(), torch.tensor(pos)
        )
    finally:
        kernels.set_threads(1)


@pytest.mark.parametrize("threads", [1, 2])
def test_decode_attention_kernel_matches_torch(kernels: QKernels, threads: int) -> None:
    """The kernel on the paged cache (pages of 64 positions, two layers) against torch."""
    torch.manual_seed(threads)
    heads, kv, hd, max_seq, pos = 9, 3, 64, 256, [200, 150]  # long enough to use the threads
    qkv = torch.randn(2, 1, (heads + 2 * kv) * hd)
    rope = _random_rope(max_seq, hd)
    k, v = torch.randn(2, kv, max_seq, hd), torch.randn(2, kv, max_seq, hd)
    k_ref, v_ref = k.clone(), v.clone()
    cache = KVCache(2, 2, max_seq, kv, hd, dtype=torch.float32, device=torch.device("cpu"))
    cache.prepare((1, 0), (0, 0), max(pos) + 1)  # slot 1 holds row 0: slots are any order
    for layer in (0, 1):  # the other layer gets other values: the kernel must not read them
        sign = 1 if layer == 1 else -1
        cache.layer(layer).write_and_read(
            sign * k.transpose(1, 2)[:, : max(pos) + 1],
            sign * v.transpose(1, 2)[:, : max(pos) + 1],
            1,
        )
    cache.prepare((1, 0), tuple(pos), 1)
    out = _attend_on(kernels, threads, qkv, (heads, kv, hd), rope, None, cache.layer(1), pos)
    want = _reference_attention(qkv, rope, k_ref, v_ref, pos)
    torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-4)
    for b, p in enumerate(pos):  # the new keys and values landed in the pages
        keys, values = cache.layer(1).write_and_read(
            torch.empty(2, 0, kv, hd), torch.empty(2, 0, kv, hd), max(pos) + 1
        )
        torch.testing.assert_close(keys[b, :, : p + 1], k_ref[b, :, : p + 1])
        torch.testing.assert_close(values[b, :, : p + 1], v_ref[b, :, : p + 1])


@pytest.mark.parametrize(
    ("rows", "heads", "kv", "hd"),
    [(1, 4, 1, 256), (1, 9, 3, 64), (2, 9, 3, 64), (3, 9, 3, 64), (1, 8, 8, 64)],
    ids=["gemma-1-row", "smollm2-1-row", "smollm2-2-rows", "smollm2-3-rows", "mha-1-row"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
def test_decode_attention_bits_do_not_depend_on_the_threads(
    kernels: QKernels, rows: int, heads: int, kv: int, hd: int, dtype: torch.dtype
) -> None:
    """A step with few (row, kv head) pairs is shared out one query head per task, one with
    many a pair per task, in runs of equal work: at 1, 2 and 3 threads every output and every
    appended key and value has the same bits (a request's tokens do not depend on the threads
    or the batch), in a cache of floats and in one of half floats."""
    torch.manual_seed(rows * 100 + heads)
    # long enough to use the threads; rows of unequal lengths share the work unevenly
    max_seq, pos = 1024, [700, 40, 380][:rows]
    qkv = torch.randn(rows, 1, (heads + 2 * kv) * hd)
    rope = _random_rope(max_seq, hd)
    qk_norm = 1 + 0.1 * torch.randn(heads + kv, hd)
    keys, values = torch.randn(rows, max(pos), kv, hd), torch.randn(rows, max(pos), kv, hd)
    results = []
    for threads in (1, 2, 3):
        cache = KVCache(1, rows, max_seq, kv, hd, dtype=dtype, device=torch.device("cpu"))
        cache.prepare(tuple(range(rows)), (0,) * rows, max(pos))
        cache.layer(0).write_and_read(keys, values, max(pos))
        cache.prepare(tuple(range(rows)), tuple(pos), 1)
        out = _attend_on(kernels, threads, qkv, (heads, kv, hd), rope, qk_norm, cache.layer(0), pos)
        k_all, v_all = cache.layer(0).write_and_read(
            torch.empty(rows, 0, kv, hd), torch.empty(rows, 0, kv, hd), max(pos) + 1
        )
        appended = [(k_all[b, :, p], v_all[b, :, p]) for b, p in enumerate(pos)]  # [B, KV, T, hd]
        results.append((out, appended))
    (one, one_kv), others = results[0], results[1:]
    assert torch.isfinite(one).all() and one.abs().sum() > 0
    for out, appended in others:
        assert torch.equal(out, one)
        for (k, v), (k1, v1) in zip(appended, one_kv, strict=True):
            assert torch.equal(k, k1) and torch.equal(v, v1)


def test_threaded_linear_is_identical(kernels: QKernels) -> None:
    w, x = torch.randn(3072, 576) * 0.05, torch.randn(3, 576)
    lin = make_linear(w, None, "q4", kernels=kernels)
    one = lin(x)
    kernels.set_threads(2)
    try:
        two = lin(x)
    finally:
        kernels.set_threads(1)
    assert torch.equal(one, two)


def test_a_forked_child_can_use_the_kernels(kernels: QKernels) -> None:
    """The thread pool's workers do not exist in a forked child: it must not wait for them."""
    lin = make_linear(torch.randn(3072, 576), None, "q4", kernels=kernels)
    x = torch.randn(2, 576)
    kernels.set_threads(2)
    try:
        lin(x)
        pid = os.fork()
        if pid == 0:  # child: must finish, then leave without running pytest's cleanup
            os._exit(0 if lin(x).shape == (2, 3072) else 1)
        deadline = time.monotonic() + 30
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        if done[0] == 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        assert done[0] == pid and os.waitstatus_to_exitcode(done[1]) == 0
    finally:
        kernels.set_threads(1)
