"""A tiny Qwen3-MoE GGUF in Q3_K (issue 23): its merged 3-D expert tensors and its dense
matrices run on the native Q3_K kernel, and its greedy tokens are those of the same file
dequantised and run densely in float32."""

from pathlib import Path

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
def q3_k_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("k23-moe")
    model = build_hf_model(WIDE, tmp / "hf", seed=4)
    return write_gguf(model, WIDE, tmp / "qwen3moe-Q3_K.gguf", "Q3_K")


def test_q3_k_experts_run_on_their_kernel_and_decode_as_the_dequantised_file(
    q3_k_file: Path,
) -> None:
    skip_without_kernels("q8")
    blocks, dense = load(q3_k_file, "q8"), load(q3_k_file)
    used = blocks.kernels_used()
    experts = [k for k in used if k.startswith("expert")]
    assert experts and all("Q3_K C kernel" in k for k in experts), used
    assert any("Q3_K C kernel" in k for k in used if not k.startswith("expert")), used
    for prompt in PROMPTS:
        assert greedy(blocks, prompt, 16)[0] == greedy(dense, prompt, 16)[0], prompt
