"""Gemma 3's tower from llama.cpp's mmproj GGUF: written from a tiny random
Gemma3ForConditionalGeneration, it loads (beside a text GGUF) to the same image embeddings as
the safetensors folder, and those match transformers' own."""

import io
import shutil
from pathlib import Path

import gguf
import pytest
import torch
from PIL import Image

from exo.api.images import decode_image
from exo.modelgen.mmproj_out import write_gemma3_mmproj
from exo.shared.types.text_generation import InputImage
from exo.worker.engines.gguf_reader import GGUFFile
from exo.worker.engines.models.gemma3_mmproj import (
    find_mmproj,
    load_gemma3_vision,
    load_mmproj,
)
from exo.worker.engines.models.gemma3_vision import Gemma3Vision, pixel_values
from exo.worker.engines.tests.gemma3_models import text_gguf, tiny_gemma3_folder

transformers = pytest.importorskip("transformers")

@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_gemma3_folder(tmp_path_factory.mktemp("gemma3-mmproj"))


def _image(size: tuple[int, int], seed: int) -> InputImage:
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 256, (size[1], size[0], 3), generator=g, dtype=torch.uint8)
    out = io.BytesIO()
    Image.fromarray(data.numpy()).save(out, format="PNG")
    return decode_image(out.getvalue())


IMAGES = [_image((64, 64), 1), _image((97, 41), 2), _image((30, 130), 3)]


@pytest.fixture(scope="module")
def gguf_pair(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GGUF model folder: the text file and mmproj-*.gguf beside it."""
    out = tmp_path_factory.mktemp("gemma3-gguf")
    write_gemma3_mmproj(folder, out / "mmproj-tiny-gemma3-F32.gguf")
    return text_gguf(out / "tiny-gemma3-Q8_0.gguf")


def test_mmproj_has_llama_cpp_names_and_keys(gguf_pair: Path) -> None:
    mmproj = find_mmproj(gguf_pair)
    assert mmproj is not None and mmproj.name == "mmproj-tiny-gemma3-F32.gguf"
    f = GGUFFile(mmproj)
    try:
        meta, tensors = f.metadata, f.tensors
    finally:
        f.close()
    assert meta["general.architecture"] == "clip"
    assert meta["clip.projector_type"] == "gemma3"
    assert meta["clip.has_vision_encoder"] is True
    assert meta["clip.vision.embedding_length"] == 32
    assert meta["clip.vision.projection_dim"] == 64
    assert meta["clip.vision.projector.scale_factor"] == 2  # a 4x4 grid pooled to 2x2
    assert tensors["v.patch_embd.weight"].shape == (32, 3, 16, 16)
    assert tensors["v.position_embd.weight"].shape == (16, 32)
    assert tensors["mm.input_projection.weight"].shape == (32, 64)
    for part in ("attn_q", "attn_k", "attn_v", "attn_out", "ln1", "ln2", "ffn_up", "ffn_down"):
        assert f"v.blk.1.{part}.weight" in tensors
    assert tensors["v.blk.0.ffn_up.weight"].shape == (64, 32)  # SigLIP's fc1: D -> I
    assert "v.post_ln.weight" in tensors and "mm.soft_emb_norm.weight" in tensors


def test_mmproj_gives_the_safetensors_embeddings(folder: Path, gguf_pair: Path) -> None:
    ours = Gemma3Vision.load(folder)
    loaded = load_gemma3_vision(gguf_pair)  # the text file: finds the mmproj beside it
    assert loaded.config == ours.config
    expected = ours(IMAGES)
    torch.testing.assert_close(loaded(IMAGES), expected, atol=1e-6, rtol=1e-6)
    # and both are transformers' own image features
    model = transformers.Gemma3ForConditionalGeneration.from_pretrained(folder).eval()
    pixels = torch.stack([pixel_values(im, ours.config) for im in IMAGES])
    with torch.no_grad():
        theirs = model.model.get_image_features(pixel_values=pixels).pooler_output
    scale = float(theirs.abs().max())
    torch.testing.assert_close(loaded(IMAGES), theirs, atol=1e-3 * scale, rtol=0)
    assert not torch.allclose(expected[0], expected[1])


def test_f16_mmproj_is_close(folder: Path, tmp_path: Path) -> None:
    """llama.cpp's files hold F16 matrices: dequantised, the embeddings stay close."""
    mmproj = write_gemma3_mmproj(folder, tmp_path / "mmproj-F16.gguf", matrices="F16")
    f = GGUFFile(mmproj)
    try:
        assert f.tensors["v.blk.0.attn_q.weight"].qtype == gguf.GGMLQuantizationType.F16
        assert f.tensors["v.blk.0.ln1.weight"].qtype == gguf.GGMLQuantizationType.F32
    finally:
        f.close()
    expected = Gemma3Vision.load(folder)(IMAGES)
    got = load_mmproj(mmproj)(IMAGES)
    scale = float(expected.abs().max())
    torch.testing.assert_close(got, expected, atol=1e-2 * scale, rtol=0)


def test_clear_errors(folder: Path, tmp_path: Path) -> None:
    text = text_gguf(tmp_path / "model.gguf")
    with pytest.raises(ValueError, match="no mmproj GGUF"):
        load_gemma3_vision(text)
    assert find_mmproj(text) is None
    bad = tmp_path / "other" / "mmproj-x.gguf"
    bad.parent.mkdir()
    w = gguf.GGUFWriter(str(bad), "clip")
    w.add_clip_projector_type("qwen2vl_merger")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="not Gemma 3"):
        load_mmproj(bad)
    plain = tmp_path / "plain"
    plain.mkdir()
    shutil.copy(text, plain / "model.gguf")
    shutil.copy(bad, plain / "mmproj-model.gguf")
    with pytest.raises(ValueError, match="not Gemma 3"):
        load_gemma3_vision(plain / "model.gguf")
