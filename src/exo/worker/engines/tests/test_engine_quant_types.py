"""Every supported weight type against gguf's own dequantiser, on random valid blocks."""

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from exo.modelgen.custom import Size, llama_gguf
from exo.modelgen.quants import quantize_q4_k, quantize_q6_k, random_blocks
from exo.worker.engines.cpu_kernels import (
    QKernels,
    kernels_unavailable_reason,
    load_kernels,
    load_kernels_for,
)
from exo.worker.engines.embedding import Embedding
from exo.worker.engines.engine import load_shard_weights
from exo.worker.engines.linear import (
    QuantLinear,
    RmsNorm,
    SplitLinear,
    StreamingLinear,
    choose_weight_format,
    make_linear,
)
from exo.worker.engines.llama import LlamaModel, StepInputs
from exo.worker.engines.load_report import load_plan
from exo.worker.engines.materialise import kernel_plan
from exo.worker.engines.qtensor import QuantTensor, dequantize_rows
from exo.worker.engines.weights import TensorParallel

T = GGMLQuantizationType
BLOCK_TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]
N, K = 48, 512


def _reference(qtype: GGMLQuantizationType, raw: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(dequantize(raw, qtype).reshape(raw.shape[0], -1).astype(np.float32))


@pytest.fixture(scope="module")
def kernels() -> QKernels | None:
    return load_kernels()


@pytest.fixture(scope="module")
def portable_kernels() -> QKernels | None:
    return load_kernels_for("portable")


@pytest.mark.parametrize("path", ["kernels", "portable", "torch"])
@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_linear_on_file_blocks_matches_gguf(
    qtype: GGMLQuantizationType,
    path: str,
    kernels: QKernels | None,
    portable_kernels: QKernels | None,
) -> None:
    with_kernels = path != "torch"
    if path == "portable":
        kernels = portable_kernels
    if with_kernels and kernels is None:
        pytest.skip(kernels_unavailable_reason() or "the CPU kernels did not build (see the log)")
    raw = random_blocks(qtype, N, K, seed=int(qtype))
    w = _reference(qtype, raw)
    torch.manual_seed(0)
    x, bias, gain = torch.randn(3, K), torch.randn(N), torch.rand(K) + 0.5
    residual = torch.randn(3, N)
    qt = QuantTensor(qtype, torch.from_numpy(raw), K)
    lin = make_linear(
        qt, bias, "dense", prologue=RmsNorm(gain, 1e-5), kernels=kernels if with_kernels else None
    )
    kernel_types = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, T.Q2_K, T.Q3_K)
    expected = QuantLinear if with_kernels and qtype in kernel_types else StreamingLinear
    assert isinstance(lin, expected)
    want = F.linear(F.rms_norm(x, (K,), gain, 1e-5), w, bias) + residual
    scale = want.abs().max().item()
    torch.testing.assert_close(lin(x, residual=residual), want, atol=2e-3 * scale, rtol=1e-3)


KERNEL_TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, T.Q2_K, T.Q3_K]


@pytest.mark.parametrize("qtype", KERNEL_TYPES, ids=lambda t: t.name)
def test_rows_of_a_batch_match_the_same_rows_alone(
    qtype: GGMLQuantizationType, kernels: QKernels | None
) -> None:
    """9 rows at once (the AVX2 build's 8-row weight tiles, in passes of 4, 4 and 1 rows) give
    each row what it gets alone (one row: the plain dot products), to float rounding: a batched
    request decodes the tokens it would decode alone. 37 outputs: a part tile at the end."""
    if kernels is None:
        pytest.skip(kernels_unavailable_reason() or "the CPU kernels did not build (see the log)")
    raw = random_blocks(qtype, 37, K, seed=7)
    torch.manual_seed(1)
    bias, x, residual = torch.randn(37), torch.randn(9, K), torch.randn(9, 37)
    lin = make_linear(QuantTensor(qtype, torch.from_numpy(raw), K), bias, "dense", kernels=kernels)
    assert isinstance(lin, QuantLinear)
    batched = lin(x, residual=residual)
    alone = torch.cat([lin(x[i : i + 1], residual=residual[i : i + 1]) for i in range(9)])
    want = F.linear(x, _reference(qtype, raw), bias) + residual
    scale = want.abs().max().item()
    torch.testing.assert_close(batched, alone, atol=1e-5 * scale, rtol=1e-5)
    torch.testing.assert_close(batched, want, atol=2e-3 * scale, rtol=1e-3)


@pytest.mark.parametrize("path", ["kernels", "portable", "torch"])
def test_parts_of_mixed_types_stack_like_their_concatenation(
    path: str, kernels: QKernels | None, portable_kernels: QKernels | None
) -> None:
    """q | k in Q4_K and v in Q6_K (a Q4_K_M layer), q | k Q5_0 and v Q8_0 (Gemma 3's
    Q4_K_M file): one kernel call reads every part in place, whatever its type. A part of a
    type no kernel runs (F16 blocks) splits the layer."""
    kernels = {"kernels": kernels, "portable": portable_kernels, "torch": None}[path]
    if path != "torch" and kernels is None:
        pytest.skip(kernels_unavailable_reason() or "the CPU kernels did not build (see the log)")
    for types in (
        [T.Q4_K, T.Q4_K, T.Q6_K],
        [T.Q8_0, T.Q8_0, T.Q8_0],
        [T.Q5_0, T.Q5_0, T.Q8_0],
        [T.Q5_1, T.Q4_K, T.F16],
    ):
        raws = [random_blocks(t, 16 * (i + 1), K, seed=i) for i, t in enumerate(types)]
        parts = [QuantTensor(t, torch.from_numpy(r), K) for t, r in zip(types, raws, strict=True)]
        w = torch.cat([_reference(t, r) for t, r in zip(types, raws, strict=True)])
        x = torch.randn(5, K)
        lin = make_linear(
            parts, None, "dense", prologue=RmsNorm(torch.ones(K), 1e-5), kernels=kernels
        )
        if kernels is None:  # in torch each part runs apart
            assert isinstance(lin, SplitLinear) and len(lin.parts) == 3
        elif types[-1] == T.F16:  # [q, k] in one kernel call, v dequantised in torch
            assert isinstance(lin, SplitLinear) and len(lin.parts) == 2
            assert isinstance(lin.parts[0], QuantLinear)
            assert isinstance(lin.parts[1], StreamingLinear)
        else:
            assert isinstance(lin, QuantLinear)
        want = F.linear(F.rms_norm(x, (K,), None, 1e-5), w)
        torch.testing.assert_close(lin(x), want, atol=2e-3 * want.abs().max().item(), rtol=1e-3)


@pytest.mark.parametrize("qtype", [T.Q6_K, T.Q8_0], ids=lambda t: t.name)
def test_embedding_rows_from_file_blocks(qtype: GGMLQuantizationType) -> None:
    raw = random_blocks(qtype, 40, 256, seed=3)
    table = Embedding(
        QuantTensor(qtype, torch.from_numpy(raw), 256), "q8", torch.float32, torch.device("cpu")
    )
    tokens = torch.tensor([[3, 39, 0], [7, 7, 12]])
    torch.testing.assert_close(table(tokens), _reference(qtype, raw)[tokens], atol=0, rtol=0)


def test_column_slices_on_block_boundaries_stay_blocks() -> None:
    raw = random_blocks(T.Q4_K, 8, 1024, seed=5)
    qt = QuantTensor(T.Q4_K, torch.from_numpy(raw), 1024)
    half = qt.cols(512, 1024)
    assert half is not None and half.n_bytes == qt.n_bytes // 2
    torch.testing.assert_close(half.dequantize(), _reference(T.Q4_K, raw)[:, 512:])
    assert qt.cols(0, 100) is None  # not on a block boundary: the caller dequantises


@pytest.mark.parametrize("use_kernels", [True, False])
@pytest.mark.parametrize("recipe", ["Q4_K_M", "Q8_0", "Q4_0", "Q5_1", "F16", "BF16"])
def test_generated_model_in_file_blocks_matches_dense(
    tmp_path: Path, recipe: str, use_kernels: bool
) -> None:
    """Whole model as the engine holds it (with the compiled kernels, and without them: file
    blocks dequantised per call, 16-bit floats packed by fbgemm) against all dequantised."""
    path = llama_gguf(tmp_path / "m.gguf", recipe)
    kernels = load_kernels() if use_kernels else None
    if use_kernels and kernels is None:
        pytest.skip("no compiled kernels here")
    cpu = torch.device("cpu")
    weights = load_shard_weights(path, 0, 2, plan=load_plan(cpu, torch.float32, kernels, None))
    fmt = choose_weight_format(weights.source_format, cpu, torch.float32, kernels)
    faithful = LlamaModel(weights, weight_format=fmt, kernels=kernels)
    dense = LlamaModel(load_shard_weights(path, 0, 2), weight_format="dense")
    tokens = torch.tensor([[5, 9, 100, 3]])
    outs = []
    for model in (faithful, dense):
        cache = model.new_cache(1, 8)
        outs.append(model.forward(tokens, StepInputs.single(0, 0, 4), cache))
    scale = outs[1].abs().max().item()
    torch.testing.assert_close(outs[0], outs[1], atol=2e-2 * scale, rtol=1e-2)


def test_q4_0_files_keep_their_blocks_with_the_kernels(tmp_path: Path) -> None:
    """Q4_0 stays Q4_0 at load (18-byte blocks, not widened to Q4_1's 20) and the kernels run
    those bytes as they are."""
    kernels = load_kernels()
    if kernels is None:
        pytest.skip(kernels_unavailable_reason() or "the CPU kernels did not build (see the log)")
    path = llama_gguf(tmp_path / "m.gguf", "Q4_0")
    plan = load_plan(torch.device("cpu"), torch.float32, kernels, None)
    wq = load_shard_weights(path, 0, 1, plan=plan).layers[0].wq
    assert isinstance(wq, QuantTensor) and wq.qtype == T.Q4_0
    assert wq.raw.shape[1] == wq.shape[1] // 32 * 18
    assert isinstance(make_linear(wq, None, "dense", kernels=kernels), QuantLinear)


def test_tensor_parallel_ranks_slice_file_blocks_as_they_load(tmp_path: Path) -> None:
    size = Size(hidden=512, ffn=1024, heads=4, kv_heads=2)
    path = llama_gguf(tmp_path / "m.gguf", "Q4_K_M", size)
    plan = kernel_plan(torch.float32, False)
    full = load_shard_weights(path, 0, 2, plan=plan)
    half = load_shard_weights(path, 0, 2, plan=plan, tensor_parallel=TensorParallel(1, 2))
    wd, wd_half = full.layers[0].w_down, half.layers[0].w_down  # row-parallel: columns split
    assert isinstance(wd, QuantTensor) and isinstance(wd_half, QuantTensor)
    torch.testing.assert_close(wd_half.dequantize(), wd.dequantize()[:, 512:])
    assert isinstance(half.layers[0].wq, QuantTensor) and half.layers[0].wq.shape == (256, 512)


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_k_quant_packing_round_trips_through_gguf(qtype: GGMLQuantizationType) -> None:
    """The test helper's Q4_K / Q6_K packing, read back by gguf's dequantiser."""
    x = np.random.default_rng(1).standard_normal((6, 512)).astype(np.float32)
    raw = quantize_q4_k(x) if qtype == T.Q4_K else quantize_q6_k(x)
    y = dequantize(raw, qtype).reshape(x.shape)
    group = 32 if qtype == T.Q4_K else 16  # values per sub-block scale
    sub_x = x.reshape(6, -1, group)
    span = (
        sub_x.max(-1) - np.minimum(sub_x.min(-1), 0) if qtype == T.Q4_K else np.abs(sub_x).max(-1)
    )
    levels = 15 if qtype == T.Q4_K else 31
    err = np.abs(y - x).reshape(6, -1, group).max(-1)
    assert (err <= 0.75 * span / levels + 1e-3).all()  # half a step, plus the 6/8-bit scale


@pytest.mark.parametrize("qtype", BLOCK_TYPES)
def test_dequantize_rows_equals_the_reference_exactly(qtype: GGMLQuantizationType) -> None:
    """Row lookups (the embedding, every step) give the reference's float32 values bit for bit,
    NaN and infinite scales included (Q8_0 has a torch path of its own)."""
    raw = random_blocks(qtype, 5, K, seed=11)
    raw[1, :2] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)  # a NaN scale
    raw[2, :2] = np.frombuffer(np.float16(np.inf).tobytes(), np.uint8)
    got = dequantize_rows(qtype, torch.from_numpy(raw.copy()), K)
    torch.testing.assert_close(got, _reference(qtype, raw), rtol=0, atol=0, equal_nan=True)
