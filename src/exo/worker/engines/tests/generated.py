"""Generated models of any size and weight type, for loading and memory tests and bench/load.py.

Weights are small random values, quantised to the file's type: with gguf's quantiser where it
has one, with `kquants` for Q4_K / Q6_K (gguf 0.19 cannot quantise K-quants), and as random
valid blocks for the other K-quant types (`random_blocks`: random bytes with every float16
scale field set to a small positive value).
"""

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

from exo.worker.engines.tests.kquants import quantize_q4_k, quantize_q6_k

T = GGMLQuantizationType

# Byte offsets of the float16 scale fields (d, and dmin / m) inside one block of each type.
SCALE_FIELDS: dict[GGMLQuantizationType, tuple[int, ...]] = {
    T.Q4_0: (0,),
    T.Q4_1: (0, 2),
    T.Q5_0: (0,),
    T.Q5_1: (0, 2),
    T.Q8_0: (0,),
    T.Q2_K: (80, 82),
    T.Q3_K: (108,),
    T.Q4_K: (0, 2),
    T.Q5_K: (0, 2),
    T.Q6_K: (208,),
}

FLOAT_TYPES = {T.F32: np.float32, T.F16: np.float16}


def _gguf_quantiser(qtype: GGMLQuantizationType) -> Callable[[np.ndarray], np.ndarray]:
    return lambda values: quantize(values, qtype)


QUANTISERS: dict[GGMLQuantizationType, Callable[[np.ndarray], np.ndarray]] = {
    T.Q4_K: quantize_q4_k,
    T.Q6_K: quantize_q6_k,
    **{t: _gguf_quantiser(t) for t in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0)},
}


def random_blocks(qtype: GGMLQuantizationType, rows: int, k: int, seed: int = 0) -> np.ndarray:
    """uint8 [rows, row_bytes] of valid random `qtype` blocks (or float bytes for F32/F16/BF16)."""
    rng = np.random.default_rng(seed)
    if qtype in FLOAT_TYPES:
        values = (rng.standard_normal((rows, k)) * 0.05).astype(FLOAT_TYPES[qtype])
        return values.view(np.uint8)
    if qtype == T.BF16:
        values = torch.from_numpy(rng.standard_normal((rows, k)).astype(np.float32) * 0.05)
        return values.to(torch.bfloat16).view(torch.uint8).numpy()
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, k // block, size), dtype=np.uint8)
    for offset in SCALE_FIELDS[qtype]:
        scale = rng.uniform(0.002, 0.02, size=(rows, k // block)).astype(np.float16)
        raw[..., offset : offset + 2] = scale.view(np.uint8).reshape(rows, k // block, 2)
    return raw.reshape(rows, -1)


def random_weights(qtype: GGMLQuantizationType, rows: int, k: int, seed: int = 0) -> np.ndarray:
    """uint8 [rows, row_bytes]: N(0, 0.05) values stored as `qtype`."""
    if qtype in FLOAT_TYPES or qtype == T.BF16 or qtype not in QUANTISERS:
        return random_blocks(qtype, rows, k, seed)
    values = np.random.default_rng(seed).standard_normal((rows, k)).astype(np.float32) * 0.05
    return QUANTISERS[qtype](values)


def mix(name: str, recipe: str) -> GGMLQuantizationType:
    """The type of tensor `name` in a file of `recipe` ("Q4_K_M" mixes Q4_K with Q6_K)."""
    if recipe == "Q4_K_M":
        return (
            T.Q6_K
            if ("attn_v" in name or "ffn_down" in name or name == "output.weight")
            else T.Q4_K
        )
    return T[recipe]


def write_gguf(
    path: Path,
    recipe: str,
    *,
    layers: int = 2,
    hidden: int = 256,
    ffn: int = 512,
    heads: int = 4,
    kv_heads: int = 2,
    vocab: int = 512,
) -> Path:
    """A llama GGUF with random weights of `recipe` (a GGUF type name or "Q4_K_M")."""
    return _write_gguf(path, recipe, (layers, hidden, ffn, heads, kv_heads, vocab), None)


def write_gguf_with_tokenizer(
    path: Path,
    recipe: str,
    tokenizer: Path,
    *,
    layers: int = 2,
    hidden: int = 256,
    ffn: int = 512,
    heads: int = 4,
    kv_heads: int = 2,
    chat_template: bool = True,
) -> Path:
    """`write_gguf` with the tokenizer and chat template of the GGUF file `tokenizer` (and its
    vocabulary size): a file engines can be run on end to end. ``chat_template`` False:
    the file has none (as a base model's)."""
    skip = () if chat_template else ("tokenizer.chat_template",)
    return _write_gguf(path, recipe, (layers, hidden, ffn, heads, kv_heads, 0), tokenizer, skip)


def _write_gguf(
    path: Path,
    recipe: str,
    shape: tuple[int, int, int, int, int, int],
    tokenizer: Path | None,
    skip: tuple[str, ...] = (),
) -> Path:
    layers, hidden, ffn, heads, kv_heads, vocab = shape
    w = GGUFWriter(str(path), "llama")
    if tokenizer is not None:
        vocab = copy_tokenizer(w, tokenizer, skip)
    else:
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
    w.add_block_count(layers)
    w.add_context_length(2048)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    hd = hidden // heads
    shapes: dict[str, tuple[int, int]] = {"token_embd.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"blk.{i}."
        shapes |= {
            p + "attn_q.weight": (hidden, hidden),
            p + "attn_k.weight": (kv_heads * hd, hidden),
            p + "attn_v.weight": (kv_heads * hd, hidden),
            p + "attn_output.weight": (hidden, hidden),
            p + "ffn_gate.weight": (ffn, hidden),
            p + "ffn_up.weight": (ffn, hidden),
            p + "ffn_down.weight": (hidden, ffn),
        }
    shapes["output.weight"] = (vocab, hidden)
    for n, (name, (rows, k)) in enumerate(shapes.items()):
        qtype = mix(name, recipe)
        w.add_tensor(name, random_weights(qtype, rows, k, seed=n), raw_dtype=qtype)
    norms = [f"blk.{i}.{n}_norm.weight" for i in range(layers) for n in ("attn", "ffn")]
    for name in [*norms, "output_norm.weight"]:
        w.add_tensor(name, np.ones(hidden, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def copy_tokenizer(w: GGUFWriter, source: Path, skip: tuple[str, ...] = ()) -> int:
    """Copy the `tokenizer.*` metadata of the GGUF file `source` (but the keys in `skip`);
    returns its vocabulary size."""
    from exo.worker.engines.gguf_reader import GGUFFile

    f = GGUFFile(source)
    try:
        meta = {
            k: v for k, v in f.metadata.items() if k.startswith("tokenizer.") and k not in skip
        }
    finally:
        f.close()
    for key, value in meta.items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, list(value))
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list):
        raise ValueError(f"{source} has no tokenizer.ggml.tokens")
    return len(tokens)


def write_safetensors(
    folder: Path,
    *,
    layers: int = 2,
    hidden: int = 256,
    ffn: int = 512,
    heads: int = 4,
    kv_heads: int = 2,
    vocab: int = 512,
) -> Path:
    """A llama Hugging Face folder with random BF16 weights (written one layer at a time)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "model_type": "llama", "hidden_size": hidden, "intermediate_size": ffn,
        "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "vocab_size": vocab, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 2048, "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2,
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    g = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.05).to(torch.bfloat16)

    hd = hidden // heads
    head = {
        "model.embed_tokens.weight": rand(vocab, hidden),
        "lm_head.weight": rand(vocab, hidden),
        "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16),
    }
    save_file(head, str(folder / "model-head.safetensors"))
    for i in range(layers):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        tensors = {
            p + "input_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
            p + "post_attention_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
            a + "q_proj.weight": rand(hidden, hidden),
            a + "k_proj.weight": rand(kv_heads * hd, hidden),
            a + "v_proj.weight": rand(kv_heads * hd, hidden),
            a + "o_proj.weight": rand(hidden, hidden),
            p + "mlp.gate_proj.weight": rand(ffn, hidden),
            p + "mlp.up_proj.weight": rand(ffn, hidden),
            p + "mlp.down_proj.weight": rand(hidden, ffn),
        }
        save_file(tensors, str(folder / f"model-{i:05d}.safetensors"))
    return folder
