"""Tiny random-weight models the stand-in hub serves: a Llama in two safetensors shard
files with their index, and the same weights as a GGUF file."""

import json
from pathlib import Path

import numpy as np
import torch
from gguf import GGUFWriter

from exo.worker.engines.tests.tiny_models import TINY, write_tiny_model

SAFETENSORS_REPO = "tiny-org/TinyLlama-2shard"
GGUF_REPO = "tiny-org/TinyLlama-GGUF"
# The chat template both repos carry (tokenizer_config.json, the GGUF header).
TINY_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def write_sharded_llama(folder: Path) -> Path:
    """Two shard files plus ``model.safetensors.index.json``, config and a tokenizer
    config (the support files a real repo has)."""
    model = write_tiny_model(folder, "llama")
    index_path = folder / "model.safetensors.index.json"
    if not index_path.exists():  # write again in two shards
        for f in folder.glob("*.safetensors"):
            f.unlink()
        model.save_pretrained(folder, safe_serialization=True, max_shard_size="600KB")
    index = json.loads(index_path.read_text())
    assert len(set(index["weight_map"].values())) >= 2, "the tiny model must span 2 files"
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"model_max_length": 256, "chat_template": TINY_TEMPLATE})
    )
    (folder / "README.md").write_text("# tiny\n")
    return folder


def write_tiny_gguf(path: Path, quant_name: str = "F32", seed: int = 0) -> Path:
    """The tiny Llama's shape as a GGUF file (F32 tensors; the name says which quant)."""
    cfg = TINY
    hidden, ffn, n_layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    heads, kv_heads, head_dim = (
        cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"],
    )
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> np.ndarray:
        return torch.randn(*shape, generator=gen).numpy().astype(np.float32)

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(str(path), "llama")
    writer.add_name(path.stem)
    writer.add_block_count(n_layers)
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_rope_freq_base(cfg["rope_theta"])
    writer.add_chat_template(TINY_TEMPLATE)
    writer.add_tensor("token_embd.weight", rand(cfg["vocab_size"], hidden))
    for i in range(n_layers):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", rand(hidden))
        writer.add_tensor(p + "attn_q.weight", rand(heads * head_dim, hidden))
        writer.add_tensor(p + "attn_k.weight", rand(kv_heads * head_dim, hidden))
        writer.add_tensor(p + "attn_v.weight", rand(kv_heads * head_dim, hidden))
        writer.add_tensor(p + "attn_output.weight", rand(hidden, heads * head_dim))
        writer.add_tensor(p + "ffn_norm.weight", rand(hidden))
        writer.add_tensor(p + "ffn_gate.weight", rand(ffn, hidden))
        writer.add_tensor(p + "ffn_up.weight", rand(ffn, hidden))
        writer.add_tensor(p + "ffn_down.weight", rand(hidden, ffn))
    writer.add_tensor("output_norm.weight", rand(hidden))
    writer.add_tensor("output.weight", rand(cfg["vocab_size"], hidden))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_gguf_repo(folder: Path) -> Path:
    """A GGUF repo with two quants (named, same tiny weights) and a README."""
    write_tiny_gguf(folder / "TinyLlama-Q8_0.gguf", seed=0)
    write_tiny_gguf(folder / "TinyLlama-Q4_K_M.gguf", seed=1)
    (folder / "README.md").write_text("# tiny gguf\n")
    return folder

# The embedded SmolLM2 file, served as a one-quant GGUF repo (the `smol_hub` fixture).
SMOL_REPO = "smol-org/SmolLM2-135M-Instruct-GGUF"
SMOL_FILE = "SmolLM2-135M-Instruct-Q4_1.gguf"
