"""The whole MoE feed-forward in one native call (`moe_kernels.MoeFfn`, `csrc/moe.c`'s
`exo_moe_ffn`: norm, router, routing, experts, weighted sum, residual): for each family's
generated tiny quantised file (softmax with renormalisation, DeepSeek's group-limited sigmoid
with its correction bias, scaling and shared expert, GLM's, gpt-oss's softmax over the chosen
logits with router biases and its clamped SwiGLU) it chooses the experts and weights that
`router.route` chooses, its output is the torch path's within rounding, a token's row is the
same bits alone or in a batch of 64, ties go to the lower expert, and bad input is refused.
MLA's per-head absorbed matrices as Q8_0 linears in one call (`HeadLinears`) are the einsums."""

from pathlib import Path

import pytest
import torch

from exo.worker.engines.cpu_kernels import KernelArgumentError
from exo.worker.engines.engine import load_family, load_shard_weights
from exo.worker.engines.kernel_build import X86_ISAS, Isa
from exo.worker.engines.models.base import BuildOptions
from exo.worker.engines.models.mla import MlaAttention
from exo.worker.engines.models.moe import MoeFeedForward
from exo.worker.engines.models.norms import rms_norm
from exo.worker.engines.tests.kernel_skip import kernels_for_isa as kernels_of
from exo.worker.engines.tests.moe_kernel_models import (
    FAMILIES,
    built_model,
    moe_layers,
    parts_of,
    tiny_files,
)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return tiny_files(tmp_path_factory.mktemp("moe-fused"))


def _torch_path(ffn: MoeFeedForward, h: torch.Tensor) -> torch.Tensor:
    fused, ffn.fused = ffn.fused, None
    try:
        return ffn(h)
    finally:
        ffn.fused = fused


@pytest.mark.parametrize("arch", list(FAMILIES))
@pytest.mark.parametrize("isa", X86_ISAS)
def test_fused_feed_forward_routes_and_sums_as_the_torch_path(
    files: dict[str, Path], isa: Isa, arch: str
) -> None:
    layers = moe_layers(built_model(files[arch], kernels_of(isa)))
    assert layers and all(f.fused is not None for f in layers)
    torch.manual_seed(0)
    for ffn in layers:
        fused = ffn.fused
        assert fused is not None
        d = ffn.norm.shape[0]
        for n in (1, 9, 64):
            h = torch.randn(1, n, d) * 2
            got = fused(h[0], routing=True)
            weights, experts = ffn.route(rms_norm(h[0], ffn.norm, ffn.eps))
            assert got.experts is not None and got.weights is not None
            assert torch.equal(got.experts.long(), experts), (arch, n)
            torch.testing.assert_close(got.weights, weights, rtol=1e-5, atol=1e-6)
            ref = _torch_path(ffn, h)
            assert torch.equal(ffn(h), got.out.view(1, n, d))  # what the layer runs
            scale = float((ref - h).abs().max())
            assert float((got.out.view(1, n, d) - ref).abs().max()) <= 2e-2 * scale, (arch, n)
            no_residual = fused(h[0], residual=False).out
            torch.testing.assert_close(no_residual + h[0], got.out, rtol=0, atol=1e-5 * scale)


@pytest.mark.parametrize("arch", list(FAMILIES))
def test_a_token_gives_the_same_bits_alone_or_in_a_batch_of_64(
    files: dict[str, Path], arch: str
) -> None:
    kernels = kernels_of("avx2")
    was = kernels.activations
    kernels.set_activations(8)  # (16-bit: a row's strategy depends on the rows an expert takes)
    try:
        for ffn in moe_layers(built_model(files[arch], kernels)):
            fused = ffn.fused
            assert fused is not None
            h = torch.randn(64, ffn.norm.shape[0]) * 2
            batch = fused(h).out
            alone = torch.cat([fused(h[i : i + 1]).out for i in range(64)])
            assert torch.equal(batch, alone)
    finally:
        kernels.set_activations(was)


def test_ties_go_to_the_lower_expert(files: dict[str, Path]) -> None:
    ffn = moe_layers(built_model(files["qwen3moe"], kernels_of("avx2")))[0]
    fused = ffn.fused
    assert fused is not None
    router = fused.router  # the weights the C call reads: every expert the same logit
    saved = router.clone()
    try:
        router.copy_(router[:1].expand_as(router))
        h = torch.randn(5, ffn.norm.shape[0])
        got = fused(h, routing=True)
        k = ffn.spec.top_k
        assert got.experts is not None and got.weights is not None
        assert torch.equal(got.experts, torch.arange(k, dtype=torch.int32).repeat(5, 1))
        torch.testing.assert_close(got.weights, torch.full((5, k), 1.0 / k))
    finally:
        router.copy_(saved)


def test_bad_input_is_refused(files: dict[str, Path]) -> None:
    ffn = moe_layers(built_model(files["qwen3moe"], kernels_of("avx2")))[0]
    fused = ffn.fused
    assert fused is not None
    d = ffn.norm.shape[0]
    with pytest.raises(KernelArgumentError, match="float32"):
        fused(torch.randn(2, d).double())
    with pytest.raises(KernelArgumentError, match="float32"):
        fused(torch.randn(2, d + 1))
    assert fused(torch.randn(0, d)).out.shape == (0, d)


@pytest.mark.parametrize("isa", X86_ISAS)
def test_mla_per_head_linears_are_the_einsums_in_q8_0(files: dict[str, Path], isa: Isa) -> None:
    """MLA's absorbed Wuk_h / Wuv_h as Q8_0 linears per head in one call: the float einsum's
    result within Q8_0 and 8-bit activation rounding; a row's bits alone or in a batch."""
    layers = parts_of(built_model(files["deepseek2"], kernels_of(isa)), MlaAttention)
    assert layers and all(a.k_heads is not None and a.v_heads is not None for a in layers)
    assert all(a.wk_b is None and a.wv_b is None for a in layers)  # the float copies are gone
    family, config = load_family(files["deepseek2"])
    float_model = family.build(
        load_shard_weights(files["deepseek2"], 0, config.n_layers), BuildOptions()
    )
    torch.manual_seed(0)
    for a, f in zip(layers, parts_of(float_model, MlaAttention), strict=True):
        assert f.wk_b is not None and f.wv_b is not None and f.k_heads is None
        for heads, w, eq in ((a.k_heads, f.wk_b, "bthn,hrn->bthr"),
                             (a.v_heads, f.wv_b, "bthr,hvr->bthv")):  # fmt: skip
            assert heads is not None
            x = torch.randn(2, 5, heads.h, heads.k)
            want, got = torch.einsum(eq, x, w), heads(x)
            assert float((got - want).abs().max()) <= 2e-2 * float(want.abs().max())
            alone = torch.stack([torch.stack([heads(x[b, t]) for t in range(5)]) for b in range(2)])
            assert torch.equal(got, alone)
    with pytest.raises(KernelArgumentError, match="float32"):
        k_heads = layers[0].k_heads
        assert k_heads is not None
        k_heads(torch.randn(3, k_heads.h, k_heads.k + 1))


def test_threads_split_the_work_not_the_results(files: dict[str, Path]) -> None:
    """The router's logits are split over threads by expert, the experts' rows by output row:
    two threads give one thread's bits (decode and a prefill-sized step)."""
    kernels = kernels_of("avx2")
    ffn = moe_layers(built_model(files["deepseek2"], kernels))[0]
    fused = ffn.fused
    assert fused is not None
    h = torch.randn(33, ffn.norm.shape[0]) * 2
    was = int(kernels.lib.exo_get_threads())
    kernels.set_threads(1)
    try:
        one = [fused(h[:1]).out, fused(h).out]
        kernels.set_threads(2)
        two = [fused(h[:1]).out, fused(h).out]
    finally:
        kernels.set_threads(was)
    assert all(torch.equal(a, b) for a, b in zip(one, two, strict=True))
