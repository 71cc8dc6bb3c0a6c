"""Gemma 3 with images (ARCH `gemma3-vision`): a Gemma3ForConditionalGeneration safetensors
folder (the hub's layout: the text model under `language_model.`, the SigLIP tower under
`vision_tower.vision_model.`, the projector under `multi_modal_projector.`), with its
processor files (`preprocessor_config.json`, `processor_config.json`) and a chat template
in Gemma's turn format that writes <start_of_image> for each image part.

Shape `tiny`: 4 text blocks of width 128 (3 sliding-window, 1 global, as Gemma alternates),
2/1 heads of 64, an untied head; a 2-block SigLIP tower of width 64 over 64x64 images in
4x4 patches (a 16x16 grid: 256 soft tokens, Gemma 3's count, unpooled). Shape `real-layer`:
Gemma 3 4B's per-layer shapes (text width 2560, ffn 10240, 8/4 heads of 256; 2 blocks unless
--layers) and its whole SigLIP so400m tower (27 blocks of width 1152 over 896x896 images in
14x14 patches, a 64x64 grid pooled 4x4 into 256 soft tokens): what `bench/vision.py` times.

Scales: the text as the dense families (`dense.py`: peaked logits), the text embedding at
1/sqrt(D) (Gemma multiplies it by sqrt(D)); the tower's projections at 1/sqrt(fan in) so a
patch's pixels carry through, and the projector's output at a few times the text's scale, so
the image positions dominate what attention reads and two different pictures lead to
different greedy answers. Gemma stores its RMS norms' gains minus one: stored ones are gains of
two. Without --safetensors the same model is written as a GGUF and mmproj pair
(`exo.modelgen.gemma3_pair`).
"""

import json
import math
from pathlib import Path

from exo.modelgen.blueprint import Blueprint, ChatFormat, Family, Role, TensorSpec, register
from exo.modelgen.families.dense import head_std

SPECIAL = ("<bos>", "<eos>", "<pad>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>",
           "<end_of_image>", "<image_soft_token>")  # fmt: skip

# Gemma's turns: "<start_of_turn>user\n...<end_of_turn>\n", the answer after
# "<start_of_turn>model\n"; an image part is written as <start_of_image> (the processor
# expands it into the image's soft tokens).
TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{- '<start_of_turn>' + role + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] | trim }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'image' %}{{- '<start_of_image>' }}"
    "{%- elif part['type'] == 'text' %}{{- part['text'] | trim }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<end_of_turn>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"
)

CHAT = ChatFormat(
    special_tokens=SPECIAL, bos="<bos>", eos="<end_of_turn>", template=TEMPLATE, add_bos=False
)

# text: blocks, width, ffn, heads, kv heads, head dim, window; tower: width, ffn, blocks,
# heads, image size, patch size; soft tokens per image
TEXT = {"layers": 4, "hidden": 128, "ffn": 256, "heads": 2, "kv_heads": 1, "head_dim": 64,
        "window": 32}  # fmt: skip
TOWER = {"hidden": 64, "ffn": 128, "layers": 2, "heads": 2, "image": 64, "patch": 4}
SHAPES: dict[str, tuple[dict[str, int], dict[str, int]]] = {
    "tiny": (TEXT, TOWER),
    "real-layer": (
        {"layers": 2, "hidden": 2560, "ffn": 10240, "heads": 8, "kv_heads": 4, "head_dim": 256,
         "window": 1024},
        {"hidden": 1152, "ffn": 4304, "layers": 27, "heads": 16, "image": 896, "patch": 14},
    ),
}  # fmt: skip
TOKENS_PER_IMAGE = 256
IMAGE_SCALE = 4.0  # the projector's output RMS relative to the text embeddings'


def _spec(name: str, shape: tuple[int, ...], role: Role, std: float,
          layer: int | None = None) -> TensorSpec:  # fmt: skip
    return TensorSpec(name, name, shape, role, layer, std)


def _text_tensors(t: dict[str, int], layers: int, vocab: int) -> list[TensorSpec]:
    h, hd = t["hidden"], t["head_dim"]
    q, kv, ffn = t["heads"] * hd, t["kv_heads"] * hd, t["ffn"]
    proj, residual = 1 / math.sqrt(h), 1 / math.sqrt(2 * layers)
    out = [_spec("language_model.model.embed_tokens.weight", (vocab, h), Role.EMBEDDING,
                 1 / math.sqrt(h))]  # fmt: skip
    for i in range(layers):
        m = f"language_model.model.layers.{i}."
        a = m + "self_attn."
        norms = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                 "post_feedforward_layernorm")  # fmt: skip
        out += [_spec(f"{m}{n}.weight", (h,), Role.NORM, 0, i) for n in norms]
        out += [
            _spec(a + "q_proj.weight", (q, h), Role.ATTN_Q, proj, i),
            _spec(a + "k_proj.weight", (kv, h), Role.ATTN_K, proj, i),
            _spec(a + "v_proj.weight", (kv, h), Role.ATTN_V, proj, i),
            _spec(a + "o_proj.weight", (h, q), Role.ATTN_OUTPUT, residual / math.sqrt(q), i),
            _spec(a + "q_norm.weight", (hd,), Role.NORM, 0, i),
            _spec(a + "k_norm.weight", (hd,), Role.NORM, 0, i),
            _spec(m + "mlp.gate_proj.weight", (ffn, h), Role.FFN_GATE, proj, i),
            _spec(m + "mlp.up_proj.weight", (ffn, h), Role.FFN_UP, proj, i),
            _spec(m + "mlp.down_proj.weight", (h, ffn), Role.FFN_DOWN, residual / math.sqrt(ffn),
                  i),
        ]  # fmt: skip
    out += [
        _spec("language_model.model.norm.weight", (h,), Role.NORM, 0),
        _spec("language_model.lm_head.weight", (vocab, h), Role.OUTPUT, head_std(h)),
    ]
    return out


def _tower_tensors(v: dict[str, int], text_hidden: int) -> list[TensorSpec]:
    d, ffn, p = v["hidden"], v["ffn"], v["patch"]
    patches = (v["image"] // p) ** 2
    bias = 0.02
    base = "vision_tower.vision_model."
    out = [
        _spec(base + "embeddings.patch_embedding.weight", (d, 3, p, p), Role.ATTN_Q,
              1 / math.sqrt(3 * p * p)),
        _spec(base + "embeddings.patch_embedding.bias", (d,), Role.ATTN_V, bias),
        _spec(base + "embeddings.position_embedding.weight", (patches, d), Role.ATTN_V, 0.1),
    ]  # fmt: skip
    for i in range(v["layers"]):
        m = f"{base}encoder.layers.{i}."
        for norm in ("layer_norm1", "layer_norm2"):
            out += [_spec(f"{m}{norm}.weight", (d,), Role.NORM, 0, i),
                    _spec(f"{m}{norm}.bias", (d,), Role.ATTN_V, bias, i)]  # fmt: skip
        shapes = {"self_attn.q_proj": (d, d), "self_attn.k_proj": (d, d),
                  "self_attn.v_proj": (d, d), "self_attn.out_proj": (d, d),
                  "mlp.fc1": (ffn, d), "mlp.fc2": (d, ffn)}  # fmt: skip
        for name, shape in shapes.items():
            out += [_spec(f"{m}{name}.weight", shape, Role.ATTN_Q, 1 / math.sqrt(shape[1]), i),
                    _spec(f"{m}{name}.bias", (shape[0],), Role.ATTN_V, bias, i)]  # fmt: skip
    out += [
        _spec(base + "post_layernorm.weight", (d,), Role.NORM, 0),
        _spec(base + "post_layernorm.bias", (d,), Role.ATTN_V, bias),
        _spec("multi_modal_projector.mm_soft_emb_norm.weight", (d,), Role.NORM, 0),
        # (the soft norm's gain is 2: each of a row's values comes out ~ IMAGE_SCALE)
        _spec("multi_modal_projector.mm_input_projection_weight", (d, text_hidden),
              Role.ATTN_Q, IMAGE_SCALE / 2 / math.sqrt(d)),
    ]  # fmt: skip
    return out


def _ids(vocab: int) -> dict[str, int]:
    """The special tokens' ids: appended in order after SmolLM2's vocabulary."""
    first = vocab - len(SPECIAL)
    return {token: first + i for i, token in enumerate(SPECIAL)}


def _config(t: dict[str, int], v: dict[str, int], layers: int, vocab: int) -> dict[str, object]:
    ids = _ids(vocab)
    sliding = ["sliding_attention" if (i + 1) % 4 else "full_attention" for i in range(layers)]
    text = {
        "model_type": "gemma3_text", "vocab_size": vocab, "hidden_size": t["hidden"],
        "intermediate_size": t["ffn"], "num_hidden_layers": layers,
        "num_attention_heads": t["heads"], "num_key_value_heads": t["kv_heads"],
        "head_dim": t["head_dim"], "query_pre_attn_scalar": t["head_dim"],
        "sliding_window": t["window"], "layer_types": sliding, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096, "hidden_activation": "gelu_pytorch_tanh",
        "rope_theta": 1_000_000.0, "rope_local_base_freq": 10000.0,
        "tie_word_embeddings": False, "pad_token_id": ids["<pad>"],
    }  # fmt: skip
    vision = {
        "model_type": "siglip_vision_model", "hidden_size": v["hidden"],
        "intermediate_size": v["ffn"], "num_hidden_layers": v["layers"],
        "num_attention_heads": v["heads"], "image_size": v["image"], "patch_size": v["patch"],
        "num_channels": 3, "layer_norm_eps": 1e-6, "hidden_act": "gelu_pytorch_tanh",
        "vision_use_head": False,
    }  # fmt: skip
    return {
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "text_config": text, "vision_config": vision, "mm_tokens_per_image": TOKENS_PER_IMAGE,
        "boi_token_index": ids["<start_of_image>"], "eoi_token_index": ids["<end_of_image>"],
        "image_token_index": ids["<image_soft_token>"], "tie_word_embeddings": False,
    }  # fmt: skip


class Gemma3Vision(Family):
    name = "gemma3-vision"
    shapes = tuple(SHAPES)
    chat = CHAT
    mmproj_pair = True  # without --safetensors: gemma3_pair writes the GGUF + mmproj pair

    def blueprint(self, shape: str, layers: int | None, vocab: int) -> Blueprint:
        if shape not in self.shapes:
            raise ValueError(f"unknown shape {shape!r} (choose from {', '.join(self.shapes)})")
        text, tower = SHAPES[shape]
        n = text["layers"] if layers is None else layers
        if n < 1:
            raise ValueError(f"--layers must be at least 1, not {n}")
        return Blueprint(
            arch=self.name,
            gguf_arch="gemma3",
            shape_name=shape,
            n_layers=n,
            tensors=(*_text_tensors(text, n, vocab), *_tower_tensors(tower, text["hidden"])),
            metadata=(),
            hf_config=_config(text, tower, n, vocab),
        )

    def write_extra(self, folder: Path) -> None:
        """The processor's files: resize to the tower's square, scale by 1/255, normalise by
        mean and std 0.5 (as Gemma 3's), and the image's soft token count (the tower's image size
        from the folder's config.json, written before these)."""
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        size = int(config["vision_config"]["image_size"])
        pre = {
            "image_processor_type": "Gemma3ImageProcessor", "processor_class": "Gemma3Processor",
            "do_convert_rgb": True, "do_resize": True, "size": {"height": size, "width": size},
            "resample": 2, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
            "do_pan_and_scan": False,
        }  # fmt: skip
        processor = {"processor_class": "Gemma3Processor", "image_seq_length": TOKENS_PER_IMAGE}
        for name, value in (("preprocessor_config.json", pre),
                            ("processor_config.json", processor)):  # fmt: skip
            (folder / name).write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")


register(Gemma3Vision())
