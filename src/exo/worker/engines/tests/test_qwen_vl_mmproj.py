"""Qwen2.5-VL and Qwen3-VL from a GGUF pair (a ``qwen2vl`` / ``qwen3vl`` text GGUF and
llama.cpp's mmproj beside it), both written from a tiny random transformers checkpoint: the mmproj loads to the same image
embeddings as the safetensors folder, and the pair gives the folder's first logits and 16
greedy tokens for an image prompt through the engine."""

from dataclasses import replace
from pathlib import Path
from typing import cast

import gguf
import pytest
import torch

from exo.modelgen.qwen_vl_gguf_out import write_qwen_vl_mmproj, write_qwen_vl_text_gguf
from exo.shared.types.text_generation import InputImage
from exo.worker.download.cards import card_from_hub
from exo.worker.download.hub import HubSettings
from exo.worker.download.tests.hub_server import FakeHub, serve_hub
from exo.worker.download.vision_card import local_vision_fields
from exo.worker.engines.batch import BatchGenerator
from exo.worker.engines.engine import load_model, load_vision
from exo.worker.engines.gguf_reader import GGUFFile
from exo.worker.engines.models.base import ShardModel, StepInputs
from exo.worker.engines.models.qwen_vl import QwenVLConfig
from exo.worker.engines.models.qwen_vl_encoder import QwenVLEncoder
from exo.worker.engines.models.qwen_vl_mmproj import load_qwen_vision
from exo.worker.engines.sampling import SamplingParams
from exo.worker.engines.tests.qwen_vl_models import (
    END,
    IMAGE,
    START,
    VOCAB,
    png,
    qwen3_config,
    qwen25_config,
    write_model,
)

transformers = pytest.importorskip("transformers")
IMAGES = [png((230, 150), 1), png((61, 190), 3), png((97, 41), 5)]


def _vocab(w: gguf.GGUFWriter) -> None:
    tokens = [f"t{i}" for i in range(VOCAB)]
    tokens[START], tokens[END], tokens[IMAGE] = (
        "<|vision_start|>",
        "<|vision_end|>",
        "<|image_pad|>",
    )
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = qwen25_config() if request.param == "qwen2_5_vl" else qwen3_config()
    return write_model(config, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def pair(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The text GGUF's path, the mmproj beside it."""
    out = tmp_path_factory.mktemp(f"{folder.name}-gguf")
    write_qwen_vl_mmproj(folder, out / "mmproj-tiny-F32.gguf")
    return write_qwen_vl_text_gguf(folder, out / "tiny-F32.gguf", _vocab)


def _metadata(path: Path) -> tuple[dict[str, object], set[str]]:
    f = GGUFFile(path)
    try:
        return dict(f.metadata), set(f.tensors)
    finally:
        f.close()


def test_mmproj_has_llama_cpp_names_and_keys(pair: Path) -> None:
    meta, tensors = _metadata(pair.with_name("mmproj-tiny-F32.gguf"))
    text, _ = _metadata(pair)
    assert meta["general.architecture"] == "clip"
    assert {"v.patch_embd.weight", "v.patch_embd.weight.1", "v.post_ln.weight", "mm.0.weight",
            "mm.2.bias"} <= tensors  # fmt: skip
    if meta["clip.projector_type"] == "qwen2.5vl_merger":
        assert meta["clip.vision.n_wa_pattern"] == 2  # fullatt_block_indexes [1]
        assert meta["clip.vision.window_size"] == 56
        assert {"v.blk.2.attn_q.bias", "v.blk.0.ffn_gate.weight"} <= tensors
        assert not any("qkv" in t for t in tensors)
        assert text["general.architecture"] == "qwen2vl"
        assert list(cast(list[int], text["qwen2vl.rope.dimension_sections"])) == [2, 3, 3, 0]
        return
    assert meta["clip.projector_type"] == "qwen3vl_merger"
    assert meta["clip.vision.is_deepstack_layers"] == [True, False, True]
    assert {"v.patch_embd.bias", "v.position_embd.weight", "v.blk.1.attn_qkv.weight",
            "v.blk.0.ffn_up.bias", "v.post_ln.bias", "v.deepstack.0.fc1.weight",
            "v.deepstack.2.norm.bias", "v.deepstack.2.fc2.bias"} <= tensors  # fmt: skip
    assert text["general.architecture"] == "qwen3vl"
    assert text["qwen3vl.n_deepstack_layers"] == 2
    assert list(cast(list[int], text["qwen3vl.rope.dimension_sections"])) == [4, 2, 2, 0]


def test_mmproj_gives_the_safetensors_embeddings(folder: Path, pair: Path) -> None:
    theirs = load_vision(folder)
    ours = load_vision(pair)
    assert isinstance(theirs, QwenVLEncoder) and isinstance(ours, QwenVLEncoder)
    assert ours.vision.config == theirs.vision.config
    a_p, b_p = ours.vision.processing, theirs.vision.processing
    assert replace(a_p, mean=b_p.mean, std=b_p.std) == b_p  # (the file's floats are float32)
    assert a_p.mean == pytest.approx(b_p.mean, abs=1e-7)
    assert a_p.std == pytest.approx(b_p.std, abs=1e-7)
    assert (ours.image_token, ours.marker) == (theirs.image_token, theirs.marker)
    a, b = ours.vision.encode(IMAGES), theirs.vision.encode(IMAGES)
    assert a.grids == b.grids and len(a.deepstack) == len(b.deepstack)
    torch.testing.assert_close(a.embeds, b.embeds, atol=1e-5, rtol=0)
    for x, y in zip(a.deepstack, b.deepstack, strict=True):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=0)


def test_f16_mmproj_is_close(folder: Path, tmp_path: Path) -> None:
    path = write_qwen_vl_mmproj(folder, tmp_path / "mmproj-f16.gguf", "F16")
    ours = load_qwen_vision(path).encode(IMAGES[:1]).embeds
    theirs = (
        load_qwen_vision(write_qwen_vl_mmproj(folder, tmp_path / "mmproj.gguf"))
        .encode(IMAGES[:1])
        .embeds
    )
    span = float(theirs.max() - theirs.min())
    torch.testing.assert_close(ours, theirs, atol=1e-2 * span, rtol=0)


def _ids(encoder: QwenVLEncoder, images: list[InputImage]) -> list[int]:
    ids: list[int] = [5, 6, 7]
    for image in images:
        ids += [START, *[IMAGE] * encoder.tokens_for(image), END, 8, 9]
    return [*ids, 10, 11]


def _generate(model: ShardModel, ids: list[int], encoder: QwenVLEncoder,
              images: list[InputImage]) -> tuple[torch.Tensor, list[int]]:  # fmt: skip
    spans = encoder.encode(ids, images)
    with torch.inference_mode():
        step = StepInputs.single(0, 0, len(ids), spans.chunk(0, len(ids)))
        first = model.forward(torch.tensor([ids]), step, model.new_cache(1, 512))[0]
    gen = BatchGenerator(model, 1, 512, prefill_chunk=512)
    gen.add("a", ids, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True), spans)
    tokens: list[int] = []
    while gen.active:
        for o in gen.step():
            assert o.finish_reason != "error", o.error
            if o.token_id is not None:
                tokens.append(o.token_id)
    return first, tokens


def test_the_gguf_pair_answers_as_the_folder(folder: Path, pair: Path, tmp_path: Path) -> None:
    config, model = load_model(pair, cache_dir=tmp_path, weight_format="dense")
    their_config, reference = load_model(folder, cache_dir=tmp_path, weight_format="dense")
    assert isinstance(config, QwenVLConfig) and isinstance(their_config, QwenVLConfig)
    for key in ("mrope_sections", "mrope_interleaved", "deepstack_layers", "image_token_id",
                "qkv_bias", "qk_norm", "head_dim", "rope_theta", "tie_embeddings"):  # fmt: skip
        assert getattr(config, key) == getattr(their_config, key), key
    encoder, their_encoder = load_vision(pair), load_vision(folder)
    assert isinstance(encoder, QwenVLEncoder) and isinstance(their_encoder, QwenVLEncoder)
    ids = _ids(encoder, IMAGES[:2])
    first, tokens = _generate(model, ids, encoder, IMAGES[:2])
    their_first, their_tokens = _generate(reference, ids, their_encoder, IMAGES[:2])
    span = float(their_first.max() - their_first.min())
    torch.testing.assert_close(first, their_first, atol=1e-4 * span, rtol=0)
    assert tokens == their_tokens and len(tokens) == 16


def test_clear_errors(tmp_path: Path) -> None:
    bad = tmp_path / "mmproj-bad.gguf"
    w = gguf.GGUFWriter(str(bad), "clip")
    w.add_clip_projector_type("qwen2.5vl_merger")
    for add in (w.add_vision_block_count, w.add_vision_embedding_length,
                w.add_vision_feed_forward_length, w.add_vision_head_count,
                w.add_vision_projection_dim, w.add_vision_patch_size):  # fmt: skip
        add(2)
    w.add_tensor("v.patch_embd.weight", torch.zeros(2, 3, 2, 2).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match=r"missing tensors v\.patch_embd\.weight\.1"):
        load_qwen_vision(bad)
    with pytest.raises(ValueError, match="model_type 'qwen2' is not qwen2_5_vl or qwen3_vl"):
        other = tmp_path / "q2"
        other.mkdir()
        (other / "config.json").write_text('{"model_type": "qwen2"}')
        write_qwen_vl_mmproj(other, tmp_path / "x.gguf")


def test_the_pairs_card_counts_the_tower_as_the_folders(folder: Path, pair: Path) -> None:
    """A GGUF + mmproj pair's card reserves the tower's memory (weights and the largest image's
    activations) as the safetensors folder's card does."""
    from_pair, from_folder = local_vision_fields(pair), local_vision_fields(folder)
    assert from_pair["vision_bytes"] == from_folder["vision_bytes"] > 0
    assert from_pair["vision_activation_bytes"] == from_folder["vision_activation_bytes"] > 0


def test_a_hub_repos_card_reads_the_tower_from_the_mmproj_header(
    folder: Path, pair: Path, tmp_path: Path
) -> None:
    """The same pair served by the stand-in hub: the card (built from headers, before any
    download) reserves the tower as the local files' card does."""
    fake = FakeHub()
    fake.add_folder("vis-org/tiny-qwen-vl-gguf", pair.parent)
    with serve_hub(fake):
        card = card_from_hub(
            "vis-org/tiny-qwen-vl-gguf", HubSettings(cache_dir=tmp_path, endpoint=fake.url)
        )
    local = local_vision_fields(folder)
    assert card.vision and card.vision_bytes == local["vision_bytes"] > 0
    assert card.vision_activation_bytes == local["vision_activation_bytes"] > 0
