"""Qwen2.5-VL's and Qwen3-VL's vision tower from llama.cpp's ``mmproj`` GGUF, loaded into the same
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
from typing import cast

import torch
from torch import Tensor

from exo.worker.engines.gguf_reader import GGUFFile
from exo.worker.engines.models.qwen_vl_encoder import QwenVision, QwenVLEncoder
from exo.worker.engines.models.qwen_vl_processor import QwenImageProcessing
from exo.worker.engines.models.qwen_vl_vision import QwenVisionConfig, QwenVisionTower, VisionKind

QWEN25_PROJECTOR = "qwen2.5vl_merger"
QWEN3_PROJECTOR = "qwen3vl_merger"
PROJECTORS: dict[str, VisionKind] = {QWEN25_PROJECTOR: "qwen2_5_vl", QWEN3_PROJECTOR: "qwen3_vl"}
DEFAULT_WINDOW = 112  # pixels a window's side, when the file does not say
# One block: llama.cpp's tensor name -> the tower's (safetensors) name under ``blocks.N.``.
BLOCK_NAMES: dict[VisionKind, dict[str, str]] = {
    "qwen2_5_vl": {"ln1": "norm1", "ln2": "norm2", "attn_out": "attn.proj",
                   "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                   "ffn_down": "mlp.down_proj"},
    "qwen3_vl": {"ln1": "norm1", "ln2": "norm2", "attn_qkv": "attn.qkv", "attn_out": "attn.proj",
                 "ffn_up": "mlp.linear_fc1", "ffn_down": "mlp.linear_fc2"},
}  # fmt: skip
MERGER_NAMES: dict[VisionKind, dict[str, str]] = {
    "qwen2_5_vl": {"v.post_ln": "merger.ln_q", "mm.0": "merger.mlp.0", "mm.2": "merger.mlp.2"},
    "qwen3_vl": {"v.post_ln": "merger.norm", "mm.0": "merger.linear_fc1",
                 "mm.2": "merger.linear_fc2"},
}  # fmt: skip
DEEPSTACK_NAMES = {"norm": "norm", "fc1": "linear_fc1", "fc2": "linear_fc2"}
TOKEN_TEXTS = {"start": "<|vision_start|>", "end": "<|vision_end|>", "pad": "<|image_pad|>"}


def _kinds(ours: str, kind: VisionKind) -> tuple[str, ...]:
    """The suffixes a tensor has: Qwen2.5-VL's RMSNorm gains have no bias."""
    rms = kind == "qwen2_5_vl" and (ours.endswith(("ln1", "ln2")) or ours == "v.post_ln")
    return ("weight",) if rms else ("weight", "bias")


def tensor_names(config: QwenVisionConfig) -> dict[str, str]:
    """Every mmproj tensor but the patch frames (and Qwen2.5-VL's split q, k, v) -> the tower's
    (safetensors) name: blocks, merger, Qwen3-VL's patch bias, positions and DeepStack mergers
    (llama.cpp numbers those by the block they follow)."""
    kind = config.kind
    pairs: dict[str, str] = dict(MERGER_NAMES[kind])
    for i in range(config.depth):
        pairs |= {f"v.blk.{i}.{a}": f"blocks.{i}.{b}" for a, b in BLOCK_NAMES[kind].items()}
    for j, block in enumerate(config.deepstack_blocks):
        pairs |= {f"v.deepstack.{block}.{a}": f"deepstack_merger_list.{j}.{b}"
                  for a, b in DEEPSTACK_NAMES.items()}  # fmt: skip
    out = {f"{a}.{k}": f"{b}.{k}" for a, b in pairs.items() for k in _kinds(a, kind)}
    if kind == "qwen3_vl":
        out |= {"v.patch_embd.bias": "patch_embed.proj.bias",
                "v.position_embd.weight": "pos_embed.weight"}  # fmt: skip
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


def mmproj_config(meta: dict[str, object], positions: int = 0
                  ) -> tuple[QwenVisionConfig, QwenImageProcessing]:  # fmt: skip
    """The tower's shape and the image processor's settings from an mmproj file's metadata
    (``positions``: the rows of Qwen3-VL's learned position table)."""
    projector = str(meta.get("clip.projector_type"))
    if projector not in PROJECTORS:
        raise ValueError(f"the mmproj file's projector is {projector!r}, not one of Qwen VL's "
                         f"({', '.join(PROJECTORS)})")  # fmt: skip
    kind = PROJECTORS[projector]
    depth = _int(meta, "clip.vision.block_count")
    pattern = _int(meta, "clip.vision.n_wa_pattern", 0)
    full = tuple(i for i in range(depth) if pattern > 0 and (i + 1) % pattern == 0)
    flags = meta.get("clip.vision.is_deepstack_layers")
    deepstack = [bool(v) for v in cast(list[object], flags)] if isinstance(flags, list) else []
    config = QwenVisionConfig(
        kind=kind,
        depth=depth,
        hidden=_int(meta, "clip.vision.embedding_length"),
        intermediate=_int(meta, "clip.vision.feed_forward_length"),
        heads=_int(meta, "clip.vision.attention.head_count"),
        out_hidden=_int(meta, "clip.vision.projection_dim"),
        patch_size=_int(meta, "clip.vision.patch_size"),
        merge_size=_int(meta, "clip.vision.spatial_merge_size", 2),
        window_size=_int(meta, "clip.vision.window_size", DEFAULT_WINDOW),
        full_attention_blocks=full if kind == "qwen2_5_vl" else (),
        position_embeddings=positions,
        deepstack_blocks=tuple(i for i, on in enumerate(deepstack) if on),
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
    back into the temporal convolution, Qwen2.5-VL's q, k, v fused back into qkv."""
    names = tensor_names(config)
    split = [f"v.blk.{i}.attn_{x}.{k}" for i in range(config.depth) for x in "qkv"
             for k in ("weight", "bias")] if config.kind == "qwen2_5_vl" else []  # fmt: skip
    wanted = ["v.patch_embd.weight", "v.patch_embd.weight.1", *names, *split]
    missing = [name for name in wanted if name not in f.tensors]
    if missing:
        raise ValueError(f"the mmproj file is missing tensors {', '.join(missing[:4])}")

    def get(name: str) -> Tensor:
        return torch.from_numpy(f.load(name).copy())

    out = {"patch_embed.proj.weight": torch.stack([get("v.patch_embd.weight"),
                                                   get("v.patch_embd.weight.1")], dim=2)}  # fmt: skip
    out |= {theirs: get(ours) for ours, theirs in names.items()}
    for i in range(config.depth if split else 0):
        for kind in ("weight", "bias"):
            parts = [get(f"v.blk.{i}.attn_{x}.{kind}") for x in "qkv"]
            out[f"blocks.{i}.attn.qkv.{kind}"] = torch.cat(parts)
    return out


def load_qwen_vision(mmproj: Path, dtype: torch.dtype = torch.float32) -> QwenVision:
    """The tower and processor settings of a Qwen2.5-VL mmproj GGUF (any tensor type the file
    holds, dequantised)."""
    f = GGUFFile(mmproj)
    try:
        table = f.model_shapes.get("v.position_embd.weight")
        config, processing = mmproj_config(dict(f.metadata), table[0] if table else 0)
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
