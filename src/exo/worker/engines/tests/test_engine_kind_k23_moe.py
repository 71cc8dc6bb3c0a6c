"""Tiny Qwen3-MoE GGUFs in Q3_K and Q2_K (issue 23): their merged 3-D expert tensors and their
dense matrices run on the native kernel of their type, and their greedy tokens are those of the
same file dequantised and run densely in float32."""

from pathlib import Path
from typing import Any, Literal

import pytest

from .kernel_skip import skip_without_kernels
from .moe_models import CASES, MoeCase, build_hf_model, write_gguf
from .test_engine_moe_families import PROMPTS, greedy, load

pytest.importorskip("transformers")

# widths of a multiple of 256 (a K-quant super-block): experts, the dense layer, the embedding
WIDE = MoeCase(
    "qwen3moe",
    "qwen3_moe",
    {
        **CASES["qwen3moe"].extra,
        "hidden_size": 256,
        "intermediate_size": 256,
        "moe_intermediate_size": 256,
    },
)


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    tmp = tmp_path_factory.mktemp("k23-moe")
    return build_hf_model(WIDE, tmp / "hf", seed=4), tmp


@pytest.mark.parametrize("qtype", ["Q3_K", "Q2_K"])
def test_experts_run_on_their_kernel_and_decode_as_the_dequantised_file(
    hf_model: tuple[Any, Path], qtype: Literal["Q2_K", "Q3_K"]
) -> None:
    skip_without_kernels("q8")
    model, tmp = hf_model
    path = write_gguf(model, WIDE, tmp / f"qwen3moe-{qtype}.gguf", qtype)
    blocks, dense = load(path, "q8"), load(path)
    used = blocks.kernels_used()
    experts = [k for k in used if k.startswith("expert")]
    assert experts and all(f"{qtype} C kernel" in k for k in experts), used
    assert any(f"{qtype} C kernel" in k for k in used if not k.startswith("expert")), used
    for prompt in PROMPTS:
        assert greedy(blocks, prompt, 16)[0] == greedy(dense, prompt, 16)[0], prompt
