"""Gemma 3's vision tower from llama.cpp's ``mmproj`` GGUF (the file its multimodal tools load
beside the text model's GGUF), and where a GGUF model keeps that file.

The mmproj layout (architecture ``clip``, projector type ``gemma3``):

* metadata ``clip.vision.{image_size, patch_size, embedding_length, feed_forward_length,
  block_count, projection_dim, attention.head_count, attention.layer_norm_epsilon,
  image_mean, image_std}``, ``clip.vision.projector.scale_factor`` (patches pooled per side
  into one soft token; 4 when absent);
* tensors ``v.patch_embd`` (the conv ``[D, C, P, P]``), ``v.position_embd``,
  ``v.blk.N.{ln1, attn_q, attn_k, attn_v, attn_out, ln2, ffn_up, ffn_down}`` (SigLIP's
  ``layer_norm1``, q/k/v/out projections, ``layer_norm2``, ``mlp.fc1``, ``mlp.fc2``),
  ``v.post_ln``, ``mm.input_projection.weight`` (``[D_vision, D_text]`` as transformers keeps
  it) and ``mm.soft_emb_norm.weight`` (stored as ``1 + w``: Gemma's RMSNorm scale folded in).

The image placeholder's id comes from the text GGUF's vocabulary (``<image_soft_token>``).
"""

from pathlib import Path

import torch
from torch import Tensor

from exo.shared.models.model_cards import is_mmproj
from exo.worker.engines.gguf_reader import GGUFFile
from exo.worker.engines.models.gemma3_vision import Gemma3Vision, Gemma3VisionConfig
from exo.worker.engines.models.siglip import SiglipConfig

IMAGE_TOKEN = "<image_soft_token>"
DEFAULT_IMAGE_TOKEN = 262144  # Gemma 3's id for it
DEFAULT_POOL = 4  # llama.cpp's proj_scale_factor when the file does not say
TOWER = "vision_tower.vision_model."
PROJECTOR = "multi_modal_projector."

# One SigLIP layer: llama.cpp's block tensor name -> transformers' name under the layer.
LAYER_NAMES: dict[str, str] = {
    "ln1": "layer_norm1",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_out": "self_attn.out_proj",
    "ln2": "layer_norm2",
    "ffn_up": "mlp.fc1",
    "ffn_down": "mlp.fc2",
}


def gguf_to_hf_names(layers: int) -> dict[str, str]:
    """Every mmproj tensor name of a Gemma 3 tower of ``layers`` blocks -> the name it has in a
    Gemma3ForConditionalGeneration checkpoint (the hub's layout)."""
    names = {
        "v.patch_embd.weight": f"{TOWER}embeddings.patch_embedding.weight",
        "v.patch_embd.bias": f"{TOWER}embeddings.patch_embedding.bias",
        "v.position_embd.weight": f"{TOWER}embeddings.position_embedding.weight",
        "v.post_ln.weight": f"{TOWER}post_layernorm.weight",
        "v.post_ln.bias": f"{TOWER}post_layernorm.bias",
        "mm.input_projection.weight": f"{PROJECTOR}mm_input_projection_weight",
        "mm.soft_emb_norm.weight": f"{PROJECTOR}mm_soft_emb_norm.weight",
    }
    for i in range(layers):
        for ours, theirs in LAYER_NAMES.items():
            for kind in ("weight", "bias"):
                names[f"v.blk.{i}.{ours}.{kind}"] = f"{TOWER}encoder.layers.{i}.{theirs}.{kind}"
    return names


def find_mmproj(model: Path) -> Path | None:
    """The mmproj GGUF beside a GGUF model file (or in a GGUF folder): the first by name, or
    None when the model has no vision projector."""
    folder = model if model.is_dir() else model.parent
    found = sorted(p for p in folder.glob("*.gguf") if p != model and is_mmproj(p.name))
    return found[0] if found else None


def _number(meta: dict[str, object], key: str, default: float | None = None) -> float:
    value = meta.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"the mmproj file has no numeric {key}")
    return float(value)


def _triple(meta: dict[str, object], key: str) -> tuple[float, float, float]:
    value = meta.get(key)
    if isinstance(value, list) and len(value) == 3:  # pyright: ignore[reportUnknownArgumentType]
        a, b, c = (float(f"{float(v):.7g}") for v in value)  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
        return a, b, c
    return 0.5, 0.5, 0.5


def text_image_token(text: Path | None) -> int:
    """The id of ``<image_soft_token>`` in the text GGUF's vocabulary (Gemma 3's default when
    no text file is given)."""
    if text is None:
        return DEFAULT_IMAGE_TOKEN
    f = GGUFFile(text)
    try:
        tokens = f.metadata.get("tokenizer.ggml.tokens")
    finally:
        f.close()
    if isinstance(tokens, list) and IMAGE_TOKEN in tokens:
        return tokens.index(IMAGE_TOKEN)
    raise ValueError(f"{text}: the vocabulary has no {IMAGE_TOKEN} (not a Gemma 3 vision model)")


def mmproj_config(meta: dict[str, object], image_token: int) -> Gemma3VisionConfig:
    """The tower and projector's shapes from an mmproj file's metadata."""
    if meta.get("clip.projector_type") != "gemma3":
        kind = meta.get("clip.projector_type")
        raise ValueError(f"the mmproj file's projector is {kind!r}, not Gemma 3's ('gemma3')")
    tower = SiglipConfig(
        hidden=int(_number(meta, "clip.vision.embedding_length")),
        intermediate=int(_number(meta, "clip.vision.feed_forward_length")),
        layers=int(_number(meta, "clip.vision.block_count")),
        heads=int(_number(meta, "clip.vision.attention.head_count")),
        image_size=int(_number(meta, "clip.vision.image_size")),
        patch_size=int(_number(meta, "clip.vision.patch_size")),
        # stored as float32: back to the decimal it was written from (1e-6, not 9.99e-7)
        eps=float(f"{_number(meta, 'clip.vision.attention.layer_norm_epsilon', 1e-6):.7g}"),
    )
    pool = int(_number(meta, "clip.vision.projector.scale_factor", DEFAULT_POOL))
    per_side = tower.patches_per_side // max(pool, 1)
    return Gemma3VisionConfig(
        tower=tower,
        text_hidden=int(_number(meta, "clip.vision.projection_dim")),
        tokens_per_image=per_side * per_side,
        image_token=image_token,
        mean=_triple(meta, "clip.vision.image_mean"),
        std=_triple(meta, "clip.vision.image_std"),
    )


def load_mmproj(
    mmproj: Path, text: Path | None = None, dtype: torch.dtype = torch.float32
) -> Gemma3Vision:
    """Gemma 3's tower and projector from an mmproj GGUF (any tensor type the file holds,
    dequantised), the image token's id from the text GGUF beside it."""
    f = GGUFFile(mmproj)
    try:
        config = mmproj_config(dict(f.metadata), text_image_token(text))
        names = gguf_to_hf_names(config.tower.layers)
        missing = sorted(set(names) - set(f.tensors))
        if missing:
            raise ValueError(f"{mmproj}: missing tensors {', '.join(missing[:4])}")
        tensors: dict[str, Tensor] = {hf: torch.from_numpy(f.load(g)) for g, hf in names.items()}
    finally:
        f.close()
    norm = f"{PROJECTOR}mm_soft_emb_norm.weight"
    tensors[norm] = tensors[norm] - 1.0  # the file holds 1 + w
    return Gemma3Vision(config, tensors, dtype)


def load_gemma3_vision(model: Path, dtype: torch.dtype = torch.float32) -> Gemma3Vision:
    """Gemma 3's image path for a model: a safetensors folder's own tensors, or the mmproj
    GGUF beside a GGUF model file."""
    if model.is_dir() and (model / "config.json").exists():
        return Gemma3Vision.load(model, dtype)
    mmproj = find_mmproj(model)
    if mmproj is None:
        raise ValueError(f"{model}: no mmproj GGUF beside the model: it takes no images")
    return load_mmproj(mmproj, model if model.is_file() else None, dtype)
