"""A tiny GLM-4.5 built by transformers' own `Glm4MoeForCausalLM`, saved as safetensors and
written as a GGUF file the way llama.cpp's converter writes a `glm4moe` model.

The tiny config keeps every feature of the family: partial rotary (half of each head), QK-norm,
attention biases, a dense first layer, group-limited sigmoid routing with the expert bias,
routed scaling and a shared expert. The GGUF file also holds the multi-token-prediction block
llama.cpp's files carry (`nextn_predict_layers`, one block more than the model's layers).
"""

from pathlib import Path
from typing import Any

import torch

from . import moe_writer as mw

CONFIG: dict[str, Any] = {
    "vocab_size": 160,
    "hidden_size": 64,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    **mw.GROUPED_ROUTER,
    "use_qk_norm": True,
    "attention_bias": True,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "initializer_range": 0.1,  # peaked next-token distributions: greedy is no coin toss
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
    },
}

_NAMES = {**mw.LAYER_NAMES, "post_attention_layernorm.weight": "post_attention_norm.weight"}


def build_glm(folder: Path, seed: int = 0, **overrides: Any) -> Any:
    """A random tiny GLM-4.5 saved to `folder` (safetensors), in eval mode."""
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

    torch.manual_seed(seed)
    model = Glm4MoeForCausalLM(Glm4MoeConfig(**{**CONFIG, **overrides})).eval()
    mw.peak(model, bias=0.1)
    model.save_pretrained(folder, safe_serialization=True)
    return model


def _tensors(model: Any) -> mw.Arrays:
    state = model.state_dict()
    out = mw.head_tensors(state)
    n = model.config.num_hidden_layers
    for i in range(n + 1):  # block n: the multi-token-prediction block (a copy of the last)
        out |= mw.layer_tensors(state, min(i, n - 1), _NAMES, block=i)
        out |= mw.merged_experts(state, min(i, n - 1), block=i)
    return out


def write_glm_gguf(
    model: Any, path: Path, dtype: mw.GgufType = "F32", tokenizer: Path | None = None
) -> Path:
    """`model` (from `build_glm`) as a llama.cpp `glm4moe` GGUF file, F32 or Q8_0 (with the
    tokenizer and chat template of the GGUF file `tokenizer`, if given)."""
    import gguf

    c = model.config
    w = gguf.GGUFWriter(str(path), "glm4moe")
    mw.add_base_meta(w, c, c.num_hidden_layers + 1, tokenizer)
    w.add_uint32("glm4moe.nextn_predict_layers", 1)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_rope_dimension_count(int(c.head_dim * c.rope_parameters["partial_rotary_factor"]))
    mw.add_grouped_router_meta(w, c)
    mw.write_tensors(w, _tensors(model), dtype)
    return path
