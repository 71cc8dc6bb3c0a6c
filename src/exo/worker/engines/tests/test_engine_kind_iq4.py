"""MXFP4, IQ4_NL and IQ4_XS on the native kernels (`csrc/iq4.h`, `iq4.c`, `arch/x86/iq4.c`):
each against `gguf.quants`' dequantisation of random blocks, a row's result the same alone or in
any batch and on every build bit for bit, a layer of such file blocks on the kernel (not the
streaming dequantiser), and the generator's IQ4_NL / IQ4_XS quantisers and recipes."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from exo.modelgen.blueprint import Role
from exo.modelgen.custom import Size, llama_blueprint
from exo.modelgen.quants import quantize_rows, random_blocks
from exo.modelgen.recipes import recipe, tensor_type
from exo.worker.engines.cpu_kernels import PROLOGUE_NONE, QuantWeights
from exo.worker.engines.kernel_build import ISAS, Isa
from exo.worker.engines.kinds import BY_NAME, Kind
from exo.worker.engines.linear import QuantLinear, StreamingLinear, make_linear
from exo.worker.engines.qtensor import QuantTensor

from .kernel_skip import kernels_for_isa as _kernels

T = GGMLQuantizationType
IQ4 = [BY_NAME[n] for n in ("MXFP4", "IQ4_NL", "IQ4_XS")]
ROWS = (1, 2, 4, 8, 9, 64)




def _weights(kind: Kind, n: int, k: int, seed: int = 5) -> tuple[torch.Tensor, QuantWeights]:
    """Random blocks of `kind` as the kernel's weights, and the same rows dequantised by gguf."""
    raw = random_blocks(T(kind.ggml), n, k, seed=seed)
    dense = torch.from_numpy(dequantize(raw, T(kind.ggml)).reshape(n, k))
    w = QuantWeights(
        kind.kernel, PROLOGUE_NONE, [torch.from_numpy(raw)], None, 0.0, None, k, [kind.kernel]
    )
    return dense, w


def _quantise16(x: torch.Tensor) -> torch.Tensor:
    """The activations as the kernels' 16-bit blocks hold them (d q), computed independently:
    d = max|x| / 32767, q = x * (32767 / max|x|) rounded to nearest even, in float32."""
    blocks = x.float().reshape(x.shape[0], -1, 32)
    mx = blocks.abs().amax(dim=2, keepdim=True)
    inv = torch.where(mx > 0, torch.tensor(32767.0) / torch.where(mx > 0, mx, 1.0), 0.0)
    q = torch.round(blocks * inv)  # half to even, as the kernels' rounding mode
    d = mx / 32767.0
    return (q.double() * d.double()).reshape(x.shape)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kind", IQ4, ids=lambda k: k.name)
def test_the_kernel_is_the_dequantised_dot(isa: Isa, kind: Kind) -> None:
    """Against gguf's dequantised rows: exact in the integers (so within float rounding of the
    dot with the 16-bit activations), within the 16-bit activations' error of F.linear."""
    ours = _kernels(isa)
    k = 768 if kind.block_values == 256 else 576  # 576: 18 blocks
    dense, w = _weights(kind, 37, k)
    torch.manual_seed(2)
    x = torch.randn(9, k) * 3
    got = ours.linear(w, x)
    scale = x.double().abs() @ dense.double().abs().T
    want = _quantise16(x) @ dense.double().T
    assert torch.all((got.double() - want).abs() <= 1e-6 * scale + 1e-6), (got - want).abs().max()
    reference = F.linear(x, dense)
    assert torch.allclose(got, reference, rtol=1e-5, atol=float(scale.max()) * 4e-5)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kind", IQ4, ids=lambda k: k.name)
def test_a_row_is_the_same_alone_or_batched_and_on_every_build(isa: Isa, kind: Kind) -> None:
    ours, portable = _kernels(isa), _kernels("portable")
    k = 512
    _, w = _weights(kind, 40, k)
    torch.manual_seed(1)
    x = torch.randn(64, k)
    alone = torch.cat([ours.linear(w, x[i : i + 1]) for i in range(64)])
    assert torch.equal(alone, portable.linear(w, x)), "differs from the portable build"
    for m in ROWS:
        assert torch.equal(ours.linear(w, x[:m]), alone[:m]), (isa, kind.name, m)


@pytest.mark.parametrize("kind", IQ4, ids=lambda k: k.name)
def test_a_layer_of_such_file_blocks_runs_on_the_kernel(kind: Kind) -> None:
    """make_linear hands a QuantTensor of the kind to the kernel (the load line names it), in
    parts with another kind too (gate | up), and gives the kernel's result."""
    kernels = _kernels("avx2")
    dense, w = _weights(kind, 24, 256)
    raw = w.parts[0]
    layer = make_linear(QuantTensor(T(kind.ggml), raw, 256), None, "q8", kernels=kernels)
    assert isinstance(layer, QuantLinear) and layer.kernel == f"{kind.name} C kernel"
    assert layer.kinds == [kind.kernel]  # no repacked layout
    x = torch.randn(3, 256)
    assert torch.equal(layer(x), kernels.linear(w, x))
    q8 = QuantTensor(
        T.Q8_0, torch.from_numpy(quantize_rows(np.ones((8, 256), np.float32), T.Q8_0)), 256
    )
    mixed = make_linear([QuantTensor(T(kind.ggml), raw, 256), q8], None, "q8", kernels=kernels)
    assert isinstance(mixed, QuantLinear) and kind.name in mixed.kernel
    y = mixed(x)
    assert torch.equal(y[:, :24], kernels.linear(w, x))
    streaming = StreamingLinear(QuantTensor(T(kind.ggml), raw, 256), None, None, torch.float32,
                                torch.device("cpu"))  # fmt: skip
    scale = float((x.abs() @ dense.abs().T).max())
    assert torch.allclose(layer(x), streaming(x), rtol=1e-5, atol=4e-5 * scale)


def _round_trip_error(qtype: GGMLQuantizationType, x: np.ndarray) -> float:
    y = dequantize(quantize_rows(x, qtype), qtype).reshape(x.shape)
    return float(np.linalg.norm(y - x) / np.linalg.norm(x))


@pytest.mark.parametrize("qtype", [T.IQ4_NL, T.IQ4_XS], ids=lambda t: t.name)
def test_the_quantisers_read_back_closer_than_q4_0(qtype: GGMLQuantizationType) -> None:
    """Random rows (of different scales) round-trip through gguf's dequantiser with a smaller
    error than Q4_0's (the same bits a value: 4.5 and 4.25); a block of zeros stays zeros."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((32, 1024), dtype=np.float32) * rng.uniform(0.01, 10, (32, 1)).astype(
        np.float32
    )
    x[3, 256:512] = 0.0
    ours, q4_0 = _round_trip_error(qtype, x), _round_trip_error(T.Q4_0, x)
    assert ours < 0.9 * q4_0, (ours, q4_0)
    assert np.all(dequantize(quantize_rows(x, qtype), qtype).reshape(x.shape)[3, 256:512] == 0)


def test_iq4_xs_sub_block_scales_are_used() -> None:
    """Sub-blocks of one super-block 16x apart in scale each keep their own 6-bit scale (with the
    largest one's scale, the small sub-block's values would all round to about d: error ~1)."""
    x = np.random.default_rng(5).standard_normal((4, 256), dtype=np.float32)
    x[:, :32] *= 4.0
    x[:, 224:] *= 0.25
    y = dequantize(quantize_rows(x, T.IQ4_XS), T.IQ4_XS).reshape(x.shape)
    for lo in (0, 32, 224):  # measured 0.084, 0.078, 0.127
        sub = slice(lo, lo + 32)
        assert np.linalg.norm(y[:, sub] - x[:, sub]) < 0.16 * np.linalg.norm(x[:, sub]), lo


@pytest.mark.parametrize("name", ["IQ4_NL", "IQ4_XS"])
def test_the_iq4_recipes_type_tensors_as_llama_cpp(name: str) -> None:
    """The head (or the tied embedding) in Q6_K (Q8_0 when rows do not fill 256-value blocks),
    IQ4_XS rows of widths not a multiple of 256 in IQ4_NL, norms F32, the rest the recipe's."""
    r = recipe(name)
    base = T[name]
    untied = llama_blueprint(Size(hidden=256, ffn=640).shape, 512)
    types = {t.gguf_name: tensor_type(r, t, untied) for t in untied.tensors}
    assert types["output.weight"] == T.Q6_K and types["token_embd.weight"] == base
    assert types["blk.0.attn_norm.weight"] == T.F32
    assert types["blk.0.attn_q.weight"] == types["blk.1.ffn_up.weight"] == base
    assert types["blk.0.ffn_down.weight"] == (T.IQ4_NL if name == "IQ4_XS" else base)  # K 640
    tied = llama_blueprint(Size(hidden=160, ffn=256, heads=5, tied=True).shape, 512)
    types = {t.gguf_name: tensor_type(r, t, tied) for t in tied.tensors}
    assert types["token_embd.weight"] == T.Q8_0  # the head's stand-in, K 160
    assert types["blk.0.ffn_down.weight"] == base
    assert {tensor_type(r, t, tied) for t in tied.tensors if t.role is Role.ATTN_Q} == {
        T.IQ4_NL
    }  # K 160
