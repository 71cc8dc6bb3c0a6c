"""The generator's quantisers, recipes and value streams, without writing files."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from exo.modelgen.blueprint import Role
from exo.modelgen.families import family
from exo.modelgen.quants import QUANTISERS, check_width, mxfp4_round, quantize_rows, row_bytes
from exo.modelgen.recipes import more_bits, recipe, tensor_type
from exo.modelgen.values import value_chunks

T = GGMLQuantizationType

# Relative RMS error of a type on N(0, 1) rows (measured: Q4_K 0.078, Q5_K 0.038, Q6_K 0.019,
# Q4_0 0.086, Q8_0 0.0053, MXFP4 0.113), with some room.
TOLERANCE = {
    T.F32: 0.0, T.F16: 1e-3, T.BF16: 4e-3, T.Q8_0: 8e-3, T.Q6_K: 3e-2, T.Q5_0: 6e-2,
    T.Q5_1: 6e-2, T.Q5_K: 6e-2, T.Q4_0: 1.1e-1, T.Q4_1: 1.1e-1, T.Q4_K: 1.1e-1, T.MXFP4: 1.3e-1,
    T.IQ4_NL: 9e-2, T.IQ4_XS: 9e-2,  # measured 0.079 (IQ4_NL, IQ4_XS)
    # issue 23 (measured: Q2_K 0.281, Q3_K 0.146)
    T.Q2_K: 3.2e-1, T.Q3_K: 1.7e-1,
}  # fmt: skip


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@pytest.mark.parametrize("qtype", list(QUANTISERS), ids=lambda t: t.name)
def test_every_quantiser_reads_back_through_gguf(qtype: GGMLQuantizationType) -> None:
    x = np.random.default_rng(3).standard_normal((24, 1024), dtype=np.float32)
    x[5] *= 40.0  # rows of very different scales: each block keeps its own
    x[6, :300] = 0.0  # a block of zeros (a zero scale must not divide)
    raw = quantize_rows(x, qtype)
    assert raw.dtype == np.uint8 and raw.shape == (24, row_bytes(qtype, 1024))
    y = dequantize(raw, qtype).reshape(x.shape)
    assert np.isfinite(y).all()
    for row in range(24):
        if row != 6:
            assert relative_error(y[row], x[row]) <= TOLERANCE[qtype], row
    assert np.abs(y[6, :256]).max() == 0.0


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q5_K, T.Q6_K], ids=lambda t: t.name)
def test_k_quants_round_to_the_nearest_step(qtype: GGMLQuantizationType) -> None:
    """Each value within about half a step of its sub-block (plus the 6/8-bit scale rounding)."""
    x = np.random.default_rng(1).standard_normal((6, 512)).astype(np.float32)
    y = dequantize(quantize_rows(x, qtype), qtype).reshape(x.shape)
    group, levels = {T.Q4_K: (32, 15), T.Q5_K: (32, 31), T.Q6_K: (16, 31)}[qtype]
    sub = x.reshape(6, -1, group)
    span = np.abs(sub).max(-1) if qtype == T.Q6_K else sub.max(-1) - np.minimum(sub.min(-1), 0)
    err = np.abs(y - x).reshape(6, -1, group).max(-1)
    assert (err <= 0.75 * span / levels + 1e-3).all()


def test_a_row_width_that_does_not_fill_blocks_is_refused() -> None:
    assert check_width(T.Q4_K, 512) is None and check_width(T.Q8_0, 96) is None
    assert "blocks of 256" in (check_width(T.Q4_K, 384) or "")


def test_values_do_not_depend_on_the_chunk_size() -> None:
    """A file's bytes are the same whatever chunk it was streamed in."""
    bp = family("llama").blueprint("tiny", 1, 1000)
    t = next(x for x in bp.tensors if x.role is Role.FFN_DOWN)
    whole = np.concatenate(list(value_chunks(t, 7, chunk_values=t.rows * t.k)))
    pieces = list(value_chunks(t, 7, chunk_values=3 * t.k))
    assert len(pieces) > 50 and all(p.dtype == np.float32 for p in pieces)
    assert np.array_equal(np.concatenate(pieces), whole)
    other = np.concatenate(list(value_chunks(t, 8, chunk_values=t.rows * t.k)))
    assert not np.array_equal(other, whole)  # the seed matters


def test_q4_k_m_is_llama_cpp_mix() -> None:
    """Q6_K for the head (the tied embedding when there is none), for attn_v and ffn_down in the
    first and last eighth of the blocks and every third between; Q4_K elsewhere; F32 norms."""
    assert [i for i in range(16) if more_bits(i, 16)] == [0, 1, 4, 7, 10, 13, 14, 15]
    r = recipe("Q4_K_M")
    for shape, head in (("1b", "token_embd.weight"), ("8b", "output.weight")):
        bp = family("llama").blueprint(shape, None, 49159)
        types = {t.gguf_name: tensor_type(r, t, bp) for t in bp.tensors}
        n = bp.n_layers
        assert types[head] == T.Q6_K
        for i in range(n):
            want = T.Q6_K if more_bits(i, n) else T.Q4_K
            assert types[f"blk.{i}.attn_v.weight"] == types[f"blk.{i}.ffn_down.weight"] == want
            assert types[f"blk.{i}.attn_q.weight"] == types[f"blk.{i}.ffn_up.weight"] == T.Q4_K
            assert types[f"blk.{i}.attn_norm.weight"] == T.F32
    bp = family("llama").blueprint("8b", None, 49159)
    assert tensor_type(r, bp.tensors[0], bp) == T.Q4_K  # an untied embedding
    assert {tensor_type(recipe("Q8_0"), t, bp) for t in bp.tensors} == {T.Q8_0, T.F32}


def test_named_shapes_are_the_real_models() -> None:
    llama = family("llama")
    one = llama.blueprint("1b", None, 49159)
    shapes = {t.gguf_name: t.shape for t in one.tensors}
    assert one.n_layers == 16 and "output.weight" not in shapes
    assert shapes["blk.0.attn_q.weight"] == (2048, 2048)
    assert shapes["blk.0.attn_k.weight"] == (512, 2048)  # 8 kv heads of 64
    assert shapes["blk.15.ffn_down.weight"] == (2048, 8192)
    eight = llama.blueprint("8b", None, 49159)
    shapes = {t.gguf_name: t.shape for t in eight.tensors}
    assert eight.n_layers == 32 and shapes["output.weight"] == (49159, 4096)
    assert shapes["blk.31.ffn_gate.weight"] == (14336, 4096)
    assert shapes["blk.0.attn_v.weight"] == (1024, 4096)  # 8 kv heads of 128
    real = llama.blueprint("real-layer", None, 49159)
    assert real.n_layers == 2 and llama.blueprint("real-layer", 3, 49159).n_layers == 3
    shapes = {t.gguf_name: t.shape for t in real.tensors}
    assert shapes["blk.1.ffn_up.weight"] == (28672, 8192)  # Llama-3.3-70B's block


def test_qwen3_shapes_have_per_head_norms_and_a_wider_q() -> None:
    bp = family("qwen3").blueprint("8b", None, 49159)
    shapes = {t.gguf_name: t.shape for t in bp.tensors}
    assert bp.n_layers == 36 and shapes["blk.0.attn_q.weight"] == (4096, 4096)
    assert shapes["blk.35.attn_k_norm.weight"] == (128,)
    tiny = {t.gguf_name: t for t in family("qwen3").blueprint("tiny", None, 1000).tensors}
    assert tiny["blk.0.attn_q.weight"].shape == (512, 256)  # 4 heads of 128 on width 256
    assert tiny["blk.0.attn_q.weight"].rope_head_dim == 0  # Hugging Face's order in a GGUF
    meta = {m.key: m.value for m in family("qwen3").blueprint("tiny", None, 1000).metadata}
    assert meta["qwen3.attention.key_length"] == 128


def test_mxfp4_round_is_ggmls_quantiser_read_back_and_a_fixed_point() -> None:
    """gpt-oss's experts are drawn on MXFP4's grid (`TensorSpec.grid`): the float rounding
    gives what quantising and dequantising gives, ties and clipped values included, and
    quantising its result again changes nothing (so MXFP4 files of it hold it exactly)."""
    x = np.random.default_rng(4).standard_normal((16, 256), dtype=np.float32) * 0.05
    x[0, :32] = 0.0
    # the block's scale is 1/16 (its largest is 10/16): each of these lies midway between codes
    x[1, :10] = np.array([2.5, -2.5, 0.5, -0.5, 1.5, 10.0, -10.0, 5.0, 7.0, 3.5]) / 16
    x[2, :3] = [15.9, -15.0, 11.0]  # codes past 12 clip
    want = dequantize(quantize_rows(x, T.MXFP4), T.MXFP4).reshape(x.shape)
    got = mxfp4_round(x)
    assert np.array_equal(got, want)
    again = dequantize(quantize_rows(got, T.MXFP4), T.MXFP4).reshape(x.shape)
    assert np.array_equal(again, got)
    spec = next(t for t in family("gpt-oss").blueprint("tiny", 1, 300).tensors if t.grid)
    chunk = next(value_chunks(spec, seed=1))
    assert spec.gguf_name.endswith("_exps.weight") and np.array_equal(mxfp4_round(chunk), chunk)
