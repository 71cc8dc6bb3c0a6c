"""The generator's Q2_K / Q3_K quantisers and mixes (issue 23): round trips through gguf's own
dequantiser, and llama.cpp's rules for which tensor of a Q2_K / Q3_K_M file gets which type."""

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from exo.modelgen.families import family
from exo.modelgen.quants import quantize_q2_k, quantize_q3_k, quantize_rows
from exo.modelgen.recipes import gqa_ratio, recipe, tensor_type

T = GGMLQuantizationType
# relative RMS error on N(0, 1) rows (measured 0.281 and 0.146; plain rounding without the
# scale search measured higher), and the largest error of one value in steps of its sub-block
BOUNDS = {T.Q2_K: (0.3, quantize_q2_k), T.Q3_K: (0.16, quantize_q3_k)}


def _round_trip(qtype: GGMLQuantizationType, x: np.ndarray) -> np.ndarray:
    raw = quantize_rows(x, qtype)
    assert raw.dtype == np.uint8
    assert raw.shape == (x.shape[0], x.shape[1] // 256 * GGML_QUANT_SIZES[qtype][1])
    return dequantize(raw, qtype).reshape(x.shape)


@pytest.mark.parametrize("qtype", list(BOUNDS), ids=lambda t: t.name)
def test_rows_read_back_through_gguf_close_to_the_source(qtype: GGMLQuantizationType) -> None:
    rng = np.random.default_rng(11)
    x = rng.standard_normal((32, 1024), dtype=np.float32)
    x[3] *= 500.0  # each super-block keeps its own scale
    x[4] *= 1e-3
    x[5, :256] = 0.0  # a zero super-block: no division by its zero scales
    x[6] = np.abs(x[6])  # one-signed rows (Q2_K's min at 0, Q3_K's peak positive)
    x[7] = -np.abs(x[7])
    y = _round_trip(qtype, x)
    assert np.isfinite(y).all()
    assert np.abs(y[5, :256]).max() == 0.0
    bound = BOUNDS[qtype][0]
    errors = [np.linalg.norm(y[r] - x[r]) / np.linalg.norm(x[r]) for r in range(32) if r != 5]
    assert max(errors) <= bound * 1.25 and float(np.mean(errors)) <= bound, errors
    assert quantize_rows(x, qtype).tobytes() == BOUNDS[qtype][1](x).tobytes()


@pytest.mark.parametrize("qtype", list(BOUNDS), ids=lambda t: t.name)
def test_each_value_is_within_a_step_of_its_sub_block(qtype: GGMLQuantizationType) -> None:
    """At most one step off (the best scale of a sub-block may clip its extreme by a little),
    and the sub-block's extremes representable: no value lost to a scale of 0."""
    x = np.random.default_rng(2).standard_normal((8, 512)).astype(np.float32)
    y = _round_trip(qtype, x)
    sub, err = x.reshape(8, -1, 16), np.abs(y - x).reshape(8, -1, 16).max(-1)
    span = sub.max(-1) - np.minimum(sub.min(-1), 0) if qtype == T.Q2_K else np.abs(sub).max(-1)
    levels = 3 if qtype == T.Q2_K else 4
    assert (err <= 1.0 * span / levels + 1e-3).all()


def test_a_spike_keeps_its_sign_and_size() -> None:
    """Q3_K's largest value goes to q = -4 whatever its sign (the level without a mirror)."""
    for sign in (1.0, -1.0):
        x = np.zeros((1, 256), dtype=np.float32)
        x[0, 37] = 5.0 * sign
        x[0, 200] = -0.5 * sign
        y = _round_trip(T.Q3_K, x)
        assert abs(y[0, 37] - x[0, 37]) <= 0.02 * 5.0
        assert abs(y[0, 200] - x[0, 200]) <= 0.3


def test_q2_k_and_q3_k_m_are_llama_cpp_mixes() -> None:
    q2, q3 = recipe("Q2_K"), recipe("Q3_K_M")
    bp = family("llama").blueprint("8b", None, 49159)  # 32 blocks, 32 heads over 8 KV heads
    assert gqa_ratio(bp) == 4
    t2 = {t.gguf_name: tensor_type(q2, t, bp) for t in bp.tensors}
    t3 = {t.gguf_name: tensor_type(q3, t, bp) for t in bp.tensors}
    assert t2["output.weight"] == t3["output.weight"] == T.Q6_K
    assert t2["token_embd.weight"] == T.Q2_K and t3["token_embd.weight"] == T.Q3_K
    for i in range(bp.n_layers):
        b = f"blk.{i}."
        assert t2[b + "attn_v.weight"] == T.Q4_K  # 4 query heads per KV head
        assert t2[b + "ffn_down.weight"] == t2[b + "attn_output.weight"] == T.Q3_K
        assert (
            t2[b + "attn_q.weight"]
            == t2[b + "ffn_up.weight"]
            == t2[b + "ffn_gate.weight"]
            == T.Q2_K
        )
        assert t3[b + "attn_v.weight"] == (T.Q5_K if i < 2 else T.Q4_K)
        assert t3[b + "ffn_down.weight"] == (T.Q5_K if i < 2 else T.Q4_K)  # first 32 / 16 blocks
        assert t3[b + "attn_output.weight"] == T.Q4_K
        assert t3[b + "attn_k.weight"] == t3[b + "ffn_up.weight"] == T.Q3_K
        assert t2[b + "attn_norm.weight"] == t3[b + "attn_norm.weight"] == T.F32
    tiny = family("llama").blueprint("tiny", None, 1000)  # 2 query heads per KV head
    assert gqa_ratio(tiny) < 4
    v = next(t for t in tiny.tensors if t.gguf_name == "blk.0.attn_v.weight")
    assert tensor_type(q2, v, tiny) == T.Q3_K
    tied = family("llama").blueprint("1b", None, 49159)  # no output.weight: the embedding
    embd = next(t for t in tied.tensors if t.gguf_name == "token_embd.weight")
    assert tensor_type(q2, embd, tied) == tensor_type(q3, embd, tied) == T.Q6_K
