"""The Qwen vision-language families (ARCH `qwen2.5-vl`, `qwen3-vl`): a dense Qwen2 / Qwen3
text model with the vision tower, M-RoPE sections and (Qwen3-VL) DeepStack mergers, written
as a Hugging Face folder (`--safetensors`) in the hub's tensor layout, with its processor
settings (`preprocessor_config.json`) and a chat template that puts
<|vision_start|><|image_pad|><|vision_end|> where a message's image goes.

Shapes: `tiny` (text: width 256, 4/2 heads of 64; Qwen2.5-VL 2 blocks, Qwen3-VL 4 with 3
DeepStack layers, so a 2-stage split holds one on its second stage; tower: 4 blocks of width
64, Qwen2.5's windows of 2x2 merged tokens with blocks 1 and 3 full, at most 64 tokens an
image) and `8b` (Qwen2.5-VL-7B / Qwen3-VL-8B). Weights as the dense families scale them (peaked
next-token distributions); the tower's are scaled so its tokens sit at the embeddings' scale
(different pictures, different answers). Without --safetensors the same model is written as
llama.cpp's GGUF and mmproj pair (`exo.modelgen.qwen_vl_pair`).
"""

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from exo.modelgen.blueprint import Blueprint, ChatFormat, Family, Role, TensorSpec, register
from exo.modelgen.families.dense import DenseShape, dense_hf_config, dense_tensors, pick_shape

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")


@dataclass(frozen=True)
class Tower:
    depth: int
    hidden: int
    ffn: int
    heads: int
    patch: int
    window: int = 112  # Qwen2.5
    full_blocks: tuple[int, ...] = ()  # Qwen2.5
    positions: int = 0  # Qwen3: learned position table (a square)
    deepstack: tuple[int, ...] = ()  # Qwen3
    max_tokens: int = 1280  # an image's tokens at most (the processor's max_pixels)


@dataclass(frozen=True)
class VLShape:
    text: DenseShape
    tower: Tower
    sections: tuple[int, int, int]


def _text(layers: int, hidden: int, ffn: int, heads: int, kv: int, theta: float,
          qk_norm: bool, tied: bool = False) -> DenseShape:  # fmt: skip
    return DenseShape(layers, hidden, ffn, heads, kv, 128 if hidden > 256 else 64, tied=tied,
                      context=8192, rope_theta=theta, norm_eps=1e-6, qk_norm=qk_norm)  # fmt: skip


QWEN25_SHAPES = {
    "tiny": VLShape(_text(2, 256, 512, 4, 2, 1e6, False),
                    Tower(4, 64, 128, 2, 14, 56, (1, 3), max_tokens=64), (8, 12, 12)),
    "8b": VLShape(_text(28, 3584, 18944, 28, 4, 1e6, False),
                  Tower(32, 1280, 3420, 16, 14, 112, (7, 15, 23, 31)), (16, 24, 24)),
}  # fmt: skip
QWEN3_SHAPES = {
    "tiny": VLShape(_text(4, 256, 512, 4, 2, 5e6, True),
                    Tower(4, 64, 128, 2, 16, positions=16, deepstack=(0, 1, 2), max_tokens=64),
                    (12, 10, 10)),
    "8b": VLShape(_text(36, 4096, 12288, 32, 8, 5e6, True),
                  Tower(27, 1152, 4304, 16, 16, positions=2304, deepstack=(8, 16, 24)),
                  (24, 20, 20)),
}  # fmt: skip

# Qwen2-VL's ChatML: an image content part becomes the vision placeholder (the engine expands
# <|image_pad|> to the image's token count).
TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'image' or 'image' in part or 'image_url' in part %}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part['type'] == 'text' %}{{- part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

CHAT = ChatFormat(
    special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>", *VISION_TOKENS),
    bos="<|endoftext|>",
    eos="<|im_end|>",
    template=TEMPLATE,
    add_bos=False,
)


def _t(name: str, shape: tuple[int, ...], std: float, role: Role = Role.FFN_UP) -> TensorSpec:
    """A tensor of the tower (or a text bias): named alike in both columns (no GGUF twin)."""
    return TensorSpec(name, name, shape, role, None, std)


def _norm(name: str, width: int, bias: bool) -> list[TensorSpec]:
    out = [_t(f"{name}.weight", (width,), 0, Role.NORM)]
    return [*out, _t(f"{name}.bias", (width,), 0.02)] if bias else out


def _linear(name: str, rows: int, cols: int, scale: float = 1.0) -> list[TensorSpec]:
    return [_t(f"{name}.weight", (rows, cols), scale / math.sqrt(cols)),
            _t(f"{name}.bias", (rows,), 0.02)]  # fmt: skip


def tower_tensors(prefix: str, t: Tower, out: int, qwen3: bool) -> list[TensorSpec]:
    """The tower's tensors under `prefix` ("visual." or "model.visual.")."""
    p, d, unit = prefix, t.hidden, 4 * t.hidden  # 2x2 merge blocks
    fan = 3 * 2 * t.patch * t.patch
    specs = [_t(p + "patch_embed.proj.weight", (d, 3, 2, t.patch, t.patch), 1 / math.sqrt(fan))]
    if qwen3:
        specs += [_t(p + "patch_embed.proj.bias", (d,), 0.02),
                  _t(p + "pos_embed.weight", (t.positions, d), 0.5)]  # fmt: skip
    residual = 1 / math.sqrt(2 * t.depth)
    for i in range(t.depth):
        b = f"{p}blocks.{i}."
        specs += _norm(b + "norm1", d, qwen3) + _norm(b + "norm2", d, qwen3)
        specs += _linear(b + "attn.qkv", 3 * d, d) + _linear(b + "attn.proj", d, d, residual)
        if qwen3:
            specs += _linear(b + "mlp.linear_fc1", t.ffn, d)
            specs += _linear(b + "mlp.linear_fc2", d, t.ffn, 2 * residual)
        else:
            specs += _linear(b + "mlp.gate_proj", t.ffn, d) + _linear(b + "mlp.up_proj", t.ffn, d)
            specs += _linear(b + "mlp.down_proj", d, t.ffn, 2 * residual)
    if qwen3:
        specs += _norm(p + "merger.norm", d, True)
        specs += _linear(p + "merger.linear_fc1", unit, unit)
        specs += _linear(p + "merger.linear_fc2", out, unit, 2.0)
        for j in range(len(t.deepstack)):
            m = f"{p}deepstack_merger_list.{j}."
            specs += _norm(m + "norm", unit, True) + _linear(m + "linear_fc1", unit, unit)
            specs += _linear(m + "linear_fc2", out, unit, 2.0)
    else:
        specs += _norm(p + "merger.ln_q", d, False)
        specs += _linear(p + "merger.mlp.0", unit, unit) + _linear(
            p + "merger.mlp.2", out, unit, 2.0
        )
    return specs


def text_tensors(s: DenseShape, vocab: int, qwen3: bool) -> list[TensorSpec]:
    """The dense stack (Hugging Face's half-split q/k order; no GGUF twin to agree with), with
    Qwen2's q/k/v biases, under "model.language_model." for Qwen3-VL (the hub's layout)."""
    specs = [replace(t, rope_head_dim=0) for t in dense_tensors(s, vocab, interleaved_rope=False)]
    if not qwen3:
        for i in range(s.layers):
            a = f"model.layers.{i}.self_attn."
            q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
            specs += [_t(a + "q_proj.bias", (q,), 0.1), _t(a + "k_proj.bias", (kv,), 0.1),
                      _t(a + "v_proj.bias", (kv,), 0.1)]  # fmt: skip
        return specs
    nested = "model.language_model."
    return [
        replace(t, hf_name=nested + t.hf_name.removeprefix("model."))
        if t.hf_name.startswith("model.") else t
        for t in specs
    ]  # fmt: skip


def _config(arch: str, s: VLShape, vocab: int) -> dict[str, object]:
    qwen3 = arch == "qwen3-vl"
    model_type = "qwen3_vl" if qwen3 else "qwen2_5_vl"
    cls = "Qwen3VLForConditionalGeneration" if qwen3 else "Qwen2_5_VLForConditionalGeneration"
    text = dense_hf_config(f"{model_type}_text", cls, s.text, vocab)
    rope: dict[str, object] = {"rope_type": "default", "rope_theta": s.text.rope_theta,
                               "mrope_section": list(s.sections)}  # fmt: skip
    if qwen3:
        rope["mrope_interleaved"] = True
    text = {k: v for k, v in text.items() if k not in ("architectures", "rope_theta")}
    text |= {"rope_parameters": rope, "attention_bias": not qwen3}
    t = s.tower
    vision: dict[str, object] = {
        "depth": t.depth, "hidden_size": t.hidden, "intermediate_size": t.ffn,
        "num_heads": t.heads, "in_channels": 3, "patch_size": t.patch, "spatial_merge_size": 2,
        "temporal_patch_size": 2, "out_hidden_size": s.text.hidden,
        "hidden_act": "gelu_pytorch_tanh" if qwen3 else "silu",
        "rope_parameters": {"rope_type": "axial", "rope_theta": 10000.0},
    }  # fmt: skip
    if qwen3:
        vision |= {"num_position_embeddings": t.positions,
                   "deepstack_visual_indexes": list(t.deepstack)}  # fmt: skip
    else:
        vision |= {"window_size": t.window, "fullatt_block_indexes": list(t.full_blocks),
                   "tokens_per_second": 2}  # fmt: skip
    first = vocab - len(VISION_TOKENS)  # the vision tokens are the vocabulary's last
    return {
        "architectures": [cls], "model_type": model_type, "text_config": text,
        "vision_config": vision, "tie_word_embeddings": s.text.tied,
        "vision_start_token_id": first, "vision_end_token_id": first + 1,
        "image_token_id": first + 2, "video_token_id": first + 3,
        "max_position_embeddings": s.text.context,
    }  # fmt: skip


def preprocessor(s: VLShape, qwen3: bool) -> str:
    factor = s.tower.patch * 2
    half = [0.5, 0.5, 0.5]
    mean = half if qwen3 else [0.48145466, 0.4578275, 0.40821073]
    std = half if qwen3 else [0.26862954, 0.26130258, 0.27577711]
    return json.dumps({
        "image_processor_type": "Qwen2VLImageProcessor", "do_resize": True, "resample": 3,
        "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "do_convert_rgb": True, "image_mean": mean, "image_std": std,
        "patch_size": s.tower.patch, "merge_size": 2, "temporal_patch_size": 2,
        "size": {"shortest_edge": factor * factor * 4,
                 "longest_edge": factor * factor * s.tower.max_tokens},
    }, indent=2) + "\n"  # fmt: skip


class QwenVL(Family):
    chat = CHAT
    mmproj_pair = True  # without --safetensors: qwen_vl_pair writes the GGUF + mmproj pair

    def __init__(self, name: str, shapes: dict[str, VLShape]) -> None:
        self.name = name
        self._shapes = shapes
        self.shapes = tuple(shapes)

    def blueprint(self, shape: str, layers: int | None, vocab: int) -> Blueprint:
        if shape not in self._shapes:
            raise ValueError(f"unknown shape {shape!r} (choose from {', '.join(self._shapes)})")
        s = self._shapes[shape]
        s = replace(s, text=pick_shape({shape: s.text}, shape, layers))
        qwen3 = self.name == "qwen3-vl"
        prefix = "model.visual." if qwen3 else "visual."
        tensors = text_tensors(s.text, vocab, qwen3)
        tensors += tower_tensors(prefix, s.tower, s.text.hidden, qwen3)
        return Blueprint(
            arch=self.name,
            gguf_arch="qwen2vl" if not qwen3 else "qwen3vl",
            shape_name=shape,
            n_layers=s.text.layers,
            tensors=tuple(tensors),
            metadata=(),
            hf_config=_config(self.name, s, vocab),
        )

    def write_extra(self, folder: Path) -> None:
        """preprocessor_config.json, for the shape whose tower config.json describes."""
        vision = json.loads((folder / "config.json").read_text(encoding="utf-8"))["vision_config"]
        shape = next(s for s in self._shapes.values()
                     if (s.tower.depth, s.tower.hidden) == (vision["depth"], vision["hidden_size"]))  # fmt: skip
        text = preprocessor(shape, self.name == "qwen3-vl")
        (folder / "preprocessor_config.json").write_text(text, encoding="utf-8")


register(QwenVL("qwen2.5-vl", QWEN25_SHAPES))
register(QwenVL("qwen3-vl", QWEN3_SHAPES))
