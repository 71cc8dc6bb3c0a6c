"""The hub's own Qwen2.5-VL-7B and Qwen3-VL-8B config.json shapes read into our configs (text
model, M-RoPE sections, tower, processor settings), and M-RoPE at their real sizes against
transformers' rotary modules: the angle of every pair for random (t, h, w) positions."""

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from exo.worker.engines.models.mrope import MRope, mrope_positions, mrope_rotation
from exo.worker.engines.models.qwen_vl import QwenVLConfig, hf_config
from exo.worker.engines.models.qwen_vl_processor import QwenImageProcessing
from exo.worker.engines.models.qwen_vl_vision import QwenVisionConfig
from exo.worker.engines.rope import rope_frequencies, rope_table

QWEN25_7B: dict[str, Any] = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"], "bos_token_id": 151643,
    "eos_token_id": 151645, "vision_start_token_id": 151652, "vision_end_token_id": 151653,
    "image_token_id": 151655, "video_token_id": 151656, "hidden_act": "silu",
    "hidden_size": 3584, "intermediate_size": 18944, "max_position_embeddings": 128000,
    "model_type": "qwen2_5_vl", "num_attention_heads": 28, "num_hidden_layers": 28,
    "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 32768, "tie_word_embeddings": False, "use_sliding_window": False,
    "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280,
                      "intermediate_size": 3420, "num_heads": 16, "in_chans": 3,
                      "out_hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2,
                      "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31],
                      "tokens_per_second": 2, "temporal_patch_size": 2},
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}, "vocab_size": 152064,
}  # fmt: skip
QWEN3_8B: dict[str, Any] = {
    "architectures": ["Qwen3VLForConditionalGeneration"], "image_token_id": 151655,
    "model_type": "qwen3_vl", "tie_word_embeddings": False, "video_token_id": 151656,
    "vision_end_token_id": 151653, "vision_start_token_id": 151652,
    "text_config": {"attention_bias": False, "bos_token_id": 151643, "eos_token_id": 151645,
                    "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
                    "intermediate_size": 12288, "max_position_embeddings": 262144,
                    "model_type": "qwen3_vl_text", "num_attention_heads": 32,
                    "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
                    "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20],
                                     "rope_type": "default"},
                    "rope_theta": 5000000, "vocab_size": 151936},
    "vision_config": {"deepstack_visual_indexes": [8, 16, 24], "depth": 27,
                      "hidden_act": "gelu_pytorch_tanh", "hidden_size": 1152, "in_channels": 3,
                      "intermediate_size": 4304, "num_heads": 16, "num_position_embeddings": 2304,
                      "out_hidden_size": 4096, "patch_size": 16, "spatial_merge_size": 2,
                      "temporal_patch_size": 2},
}  # fmt: skip


def test_the_hubs_configs_read(tmp_path: Path) -> None:
    q25 = hf_config(QWEN25_7B, tmp_path)
    assert isinstance(q25, QwenVLConfig)
    assert (q25.n_layers, q25.hidden, q25.heads, q25.kv_heads, q25.head_dim) == (
        28,
        3584,
        28,
        4,
        128,
    )
    assert q25.qkv_bias and not q25.qk_norm and q25.rope_scaling is None
    assert q25.sliding_window is None  # use_sliding_window false
    assert (q25.mrope_sections, q25.mrope_interleaved, q25.rope_theta) == ((16, 24, 24), False, 1e6)
    assert (q25.image_token_id, q25.deepstack_layers, q25.eos_token_ids) == (151655, 0, (151645,))
    q3 = hf_config(QWEN3_8B, tmp_path)
    assert isinstance(q3, QwenVLConfig)
    assert (q3.n_layers, q3.hidden, q3.ffn, q3.heads, q3.kv_heads) == (36, 4096, 12288, 32, 8)
    assert q3.qk_norm and not q3.qkv_bias and not q3.tie_embeddings
    assert (q3.mrope_sections, q3.mrope_interleaved, q3.rope_theta) == ((24, 20, 20), True, 5e6)
    assert q3.deepstack_layers == 3
    v25 = QwenVisionConfig.from_hf("qwen2_5_vl", QWEN25_7B["vision_config"])
    assert (v25.depth, v25.head_dim, v25.window_size, v25.full_attention_blocks) == (
        32, 80, 112, (7, 15, 23, 31))  # fmt: skip
    v3 = QwenVisionConfig.from_hf("qwen3_vl", QWEN3_8B["vision_config"])
    assert (v3.position_embeddings, v3.deepstack_blocks, v3.patch_size) == (2304, (8, 16, 24), 16)
    pre = {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "merge_size": 2,
           "temporal_patch_size": 2}  # fmt: skip
    p = QwenImageProcessing.from_json(pre, QWEN25_7B["vision_config"])
    assert (p.min_pixels, p.max_pixels, p.patch_size) == (3136, 12845056, 14)


def test_a_bad_mrope_section_is_refused(tmp_path: Path) -> None:
    bad = {**QWEN25_7B, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 20]}}
    with pytest.raises(ValueError, match="mrope_section"):
        hf_config(bad, tmp_path)


def _transformers_angles(config: dict[str, Any], positions: torch.Tensor) -> torch.Tensor:
    """transformers' cos of each half-split dim's angle, [T, hd] (one batch row)."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.AutoConfig.for_model(**json.loads(json.dumps(config)))
    if cfg.model_type == "qwen3_vl":
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding as R
    else:
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
            Qwen2_5_VLRotaryEmbedding as R,
        )
    rotary = R(config=cfg.text_config)
    cos, _ = rotary(torch.zeros(1, dtype=torch.float64), positions[:, None, :])
    return cos[0]


@pytest.mark.parametrize("raw", [QWEN25_7B, QWEN3_8B], ids=["qwen2.5-vl", "qwen3-vl"])
def test_mrope_turns_each_pair_as_transformers(raw: dict[str, Any], tmp_path: Path) -> None:
    config = hf_config(raw, tmp_path)
    assert isinstance(config, QwenVLConfig)
    g = torch.Generator().manual_seed(0)
    positions = torch.randint(0, 400, (3, 50), generator=g)
    table = rope_table(
        512, rope_frequencies(config.head_dim, config.rope_theta), torch.device("cpu")
    )
    ours = mrope_rotation(table, positions[:, None, :], MRope(config.mrope_sections,
                                                               config.mrope_interleaved).axes())  # fmt: skip
    theirs = _transformers_angles(raw, positions)  # [T, hd]: pair k's cos at dims k, k + hd/2
    torch.testing.assert_close(ours[0, :, 0].real, theirs[:, : config.head_dim // 2].float(),
                               atol=2e-4, rtol=0)  # fmt: skip


def test_positions_continue_after_an_image() -> None:
    ids = [1, 2, 9, 9, 9, 9, 9, 9, 3, 4]  # a 2x3 merged image at 2
    positions, delta = mrope_positions(ids, 9, [(1, 4, 6)], 2)
    assert positions[:, :2].tolist() == [[0, 1]] * 3
    assert positions[:, 2:8].tolist() == [[2] * 6, [2, 2, 2, 3, 3, 3], [2, 3, 4, 2, 3, 4]]
    assert positions[:, 8:].tolist() == [[5, 6]] * 3  # 2 + max(2, 3)
    assert delta == 7 - 10
    with pytest.raises(ValueError, match="more image placeholders"):
        mrope_positions(ids, 9, [], 2)
