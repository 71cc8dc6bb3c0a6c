"""Qwen2.5-VL's vision tower from llama.cpp's ``mmproj`` GGUF, loaded into the same
`qwen_vl_vision.QwenVisionTower` as a safetensors folder's.

The mmproj layout (architecture ``clip``, projector type ``qwen2.5vl_merger``):

* metadata ``clip.vision.{embedding_length, feed_forward_length, block_count,
  attention.head_count, projection_dim (the text width), patch_size, image_mean, image_std}``,
  ``clip.vision.n_wa_pattern`` (every n-th block attends to the whole image, the others within
  windows), optional ``clip.vision.{spatial_merge_size, window_size, image_min_pixels,
  image_max_pixels}`` (2, 112 pixels, and the processor's defaults when absent);
* tensors: the temporal patch convolution split into its two frames, ``v.patch_embd.weight``
  and ``v.patch_embd.weight.1`` (``[Dv, C, P, P]`` each); per block ``v.blk.N.{ln1, ln2}``
  (RMSNorm gains), ``attn_q, attn_k, attn_v`` (the fused qkv cut in three), ``attn_out``,
  ``ffn_gate, ffn_up, ffn_down``; the merger's norm ``v.post_ln`` and its two linears
  ``mm.0`` and ``mm.2``.

The vision tokens' ids come from the text GGUF's vocabulary (``<|image_pad|>`` ...).
"""

from pathlib import Path

import torch
from torch import Tensor

from exo.worker.engines.gguf_reader import GGUFFile
from exo.worker.engines.models.qwen_vl_encoder import QwenVision, QwenVLEncoder
from exo.worker.engines.models.qwen_vl_processor import QwenImageProcessing
from exo.worker.engines.models.qwen_vl_vision import QwenVisionConfig, QwenVisionTower

QWEN25_PROJECTOR = "qwen2.5vl_merger"
DEFAULT_WINDOW = 112  # pixels a window's side, when the file does not say
# One block: llama.cpp's tensor name -> the tower's (safetensors) name under ``blocks.N.``.
BLOCK_NAMES: dict[str, str] = {
    "ln1": "norm1", "ln2": "norm2", "attn_out": "attn.proj", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}  # fmt: skip
MERGER_NAMES: dict[str, str] = {
    "v.post_ln.weight": "merger.ln_q.weight", "mm.0.weight": "merger.mlp.0.weight",
    "mm.0.bias": "merger.mlp.0.bias", "mm.2.weight": "merger.mlp.2.weight",
    "mm.2.bias": "merger.mlp.2.bias",
}  # fmt: skip
TOKEN_TEXTS = {"start": "<|vision_start|>", "end": "<|vision_end|>", "pad": "<|image_pad|>"}


def block_names(depth: int) -> dict[str, str]:
    """The per-block tensors (not q, k, v) by mmproj name -> the tower's name."""
    out: dict[str, str] = {}
    for i in range(depth):
        for ours, theirs in BLOCK_NAMES.items():
            kinds = ("weight",) if ours in ("ln1", "ln2") else ("weight", "bias")
            for kind in kinds:
                out[f"v.blk.{i}.{ours}.{kind}"] = f"blocks.{i}.{theirs}.{kind}"
    return out


def _int(meta: dict[str, object], key: str, default: int | None = None) -> int:
    value = meta.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"the mmproj file has no integer {key}")
    return value


def _triple(meta: dict[str, object], key: str, default: tuple[float, float, float]
            ) -> tuple[float, float, float]:  # fmt: skip
    value = meta.get(key)
    if isinstance(value, list) and len(value) == 3:  # pyright: ignore[reportUnknownArgumentType]
        a, b, c = (float(v) for v in value)  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
        return a, b, c
    return default


def mmproj_config(meta: dict[str, object]) -> tuple[QwenVisionConfig, QwenImageProcessing]:
    """The tower's shape and the image processor's settings from an mmproj file's metadata."""
    kind = meta.get("clip.projector_type")
    if kind != QWEN25_PROJECTOR:
        raise ValueError(f"the mmproj file's projector is {kind!r}, not {QWEN25_PROJECTOR!r}")
    depth = _int(meta, "clip.vision.block_count")
    pattern = _int(meta, "clip.vision.n_wa_pattern", 0)
    full = tuple(i for i in range(depth) if pattern > 0 and (i + 1) % pattern == 0)
    config = QwenVisionConfig(
        kind="qwen2_5_vl",
        depth=depth,
        hidden=_int(meta, "clip.vision.embedding_length"),
        intermediate=_int(meta, "clip.vision.feed_forward_length"),
        heads=_int(meta, "clip.vision.attention.head_count"),
        out_hidden=_int(meta, "clip.vision.projection_dim"),
        patch_size=_int(meta, "clip.vision.patch_size"),
        merge_size=_int(meta, "clip.vision.spatial_merge_size", 2),
        window_size=_int(meta, "clip.vision.window_size", DEFAULT_WINDOW),
        full_attention_blocks=full,
    )
    d = QwenImageProcessing()
    processing = QwenImageProcessing(
        patch_size=config.patch_size,
        merge_size=config.merge_size,
        temporal_patch_size=2,  # llama.cpp's two patch_embd frames
        min_pixels=_int(meta, "clip.vision.image_min_pixels", d.min_pixels),
        max_pixels=_int(meta, "clip.vision.image_max_pixels", d.max_pixels),
        mean=_triple(meta, "clip.vision.image_mean", d.mean),
        std=_triple(meta, "clip.vision.image_std", d.std),
    )
    return config, processing


def _tower_tensors(f: GGUFFile, config: QwenVisionConfig) -> dict[str, Tensor]:
    """The file's tensors under the tower's (safetensors) names: the two patch frames stacked
    back into the temporal convolution, q, k, v fused back into qkv."""
    wanted = ["v.patch_embd.weight", "v.patch_embd.weight.1", *MERGER_NAMES,
              *block_names(config.depth)]  # fmt: skip
    wanted += [f"v.blk.{i}.attn_{x}.{k}" for i in range(config.depth) for x in "qkv"
               for k in ("weight", "bias")]  # fmt: skip
    missing = [name for name in wanted if name not in f.tensors]
    if missing:
        raise ValueError(f"the mmproj file is missing tensors {', '.join(missing[:4])}")

    def get(name: str) -> Tensor:
        return torch.from_numpy(f.load(name).copy())

    out = {"patch_embed.proj.weight": torch.stack([get("v.patch_embd.weight"),
                                                   get("v.patch_embd.weight.1")], dim=2)}  # fmt: skip
    out |= {theirs: get(ours) for ours, theirs in MERGER_NAMES.items()}
    out |= {theirs: get(ours) for ours, theirs in block_names(config.depth).items()}
    for i in range(config.depth):
        for kind in ("weight", "bias"):
            parts = [get(f"v.blk.{i}.attn_{x}.{kind}") for x in "qkv"]
            out[f"blocks.{i}.attn.qkv.{kind}"] = torch.cat(parts)
    return out


def load_qwen_vision(mmproj: Path, dtype: torch.dtype = torch.float32) -> QwenVision:
    """The tower and processor settings of a Qwen2.5-VL mmproj GGUF (any tensor type the file
    holds, dequantised)."""
    f = GGUFFile(mmproj)
    try:
        config, processing = mmproj_config(dict(f.metadata))
        tensors = _tower_tensors(f, config)
    finally:
        f.close()
    return QwenVision(config, processing, QwenVisionTower(config, tensors.__getitem__, dtype))


def vision_token_ids(text: Path) -> dict[str, int]:
    """The ids of the vision tokens (start, end, pad) in the text GGUF's vocabulary."""
    f = GGUFFile(text)
    try:
        tokens = f.metadata.get("tokenizer.ggml.tokens")
    finally:
        f.close()
    vocab: list[object] = list(tokens) if isinstance(tokens, list) else []  # pyright: ignore[reportUnknownArgumentType]
    missing = [t for t in TOKEN_TEXTS.values() if t not in vocab]
    if missing:
        raise ValueError(
            f"{text}: the vocabulary has no {', '.join(missing)} (not a Qwen VL model)"
        )
    return {k: vocab.index(t) for k, t in TOKEN_TEXTS.items()}


def load_qwen_mmproj(mmproj: Path, text: Path, dtype: torch.dtype = torch.float32
                     ) -> QwenVLEncoder:  # fmt: skip
    """Qwen2.5-VL's image path for a GGUF pair: the tower from the mmproj file, the vision
    tokens from the text file's vocabulary."""
    ids = vision_token_ids(text)
    return QwenVLEncoder(load_qwen_vision(mmproj, dtype), ids["pad"], dict(TOKEN_TEXTS))
