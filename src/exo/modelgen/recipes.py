"""Quantisation recipes: which GGML type each tensor of a file gets.

A plain recipe (`Q4_0`, `Q8_0`, `Q6_K`, `F16`, `BF16`...) stores every matrix in that type;
`Q4_K_M` / `Q5_K_M` follow llama.cpp's mixes: the LM head (or the tied embedding standing in
for it) in Q6_K, attn_v and ffn_down in Q6_K in the first and last eighth of the blocks and in
every third block between, everything else in Q4_K / Q5_K. `Q2_K` / `Q3_K_M` follow llama.cpp's
2- and 3-bit mixes (`low_bit_type`). `IQ4_NL` / `IQ4_XS`: llama.cpp's head rule and block-width
fallback (`iq4_tensor_type`). Norms are always F32.
"""

from dataclasses import dataclass

from gguf import GGMLQuantizationType, LlamaFileType

from exo.modelgen.blueprint import Blueprint, Role, TensorSpec

T = GGMLQuantizationType


@dataclass(frozen=True)
class Recipe:
    name: str
    base: GGMLQuantizationType
    file_type: LlamaFileType
    mixed: bool = False  # a _M mix (more bits for the head, some attn_v / ffn_down)


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe("F32", T.F32, LlamaFileType.ALL_F32),
        Recipe("F16", T.F16, LlamaFileType.MOSTLY_F16),
        Recipe("BF16", T.BF16, LlamaFileType.MOSTLY_BF16),
        Recipe("Q8_0", T.Q8_0, LlamaFileType.MOSTLY_Q8_0),
        Recipe("Q4_0", T.Q4_0, LlamaFileType.MOSTLY_Q4_0),
        Recipe("Q4_1", T.Q4_1, LlamaFileType.MOSTLY_Q4_1),
        Recipe("Q5_0", T.Q5_0, LlamaFileType.MOSTLY_Q5_0),
        Recipe("Q5_1", T.Q5_1, LlamaFileType.MOSTLY_Q5_1),
        Recipe("Q4_K", T.Q4_K, LlamaFileType.MOSTLY_Q4_K_S),
        Recipe("Q5_K", T.Q5_K, LlamaFileType.MOSTLY_Q5_K_S),
        Recipe("Q6_K", T.Q6_K, LlamaFileType.MOSTLY_Q6_K),
        Recipe("Q4_K_M", T.Q4_K, LlamaFileType.MOSTLY_Q4_K_M, mixed=True),
        Recipe("Q5_K_M", T.Q5_K, LlamaFileType.MOSTLY_Q5_K_M, mixed=True),
        Recipe("MXFP4", T.MXFP4, LlamaFileType.MOSTLY_MXFP4_MOE),
        # IQ4_NL, IQ4_XS (iq4_tensor_type)
        Recipe("IQ4_NL", T.IQ4_NL, LlamaFileType.MOSTLY_IQ4_NL),
        Recipe("IQ4_XS", T.IQ4_XS, LlamaFileType.MOSTLY_IQ4_XS),
        # issue 23: llama.cpp's 2- and 3-bit mixes (`low_bit_type` below)
        Recipe("Q2_K", T.Q2_K, LlamaFileType.MOSTLY_Q2_K),
        Recipe("Q3_K_M", T.Q3_K, LlamaFileType.MOSTLY_Q3_K_M),
    )
}

FLOAT_RECIPES = ("F32", "F16", "BF16")
"""What a safetensors folder can hold."""


def recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise ValueError(f"unknown quant {name!r} (choose from {', '.join(RECIPES)})")
    return RECIPES[name]


def more_bits(layer: int, n_layers: int) -> bool:
    """The blocks a _M mix gives more bits: first and last eighth, every third between."""
    eighth = n_layers // 8
    return layer < eighth or layer >= 7 * n_layers // 8 or (layer - eighth) % 3 == 2


def tensor_type(r: Recipe, t: TensorSpec, bp: Blueprint) -> GGMLQuantizationType:
    """The type tensor `t` of model `bp` is stored in under recipe `r`."""
    if t.role in (Role.NORM, Role.OUTPUT_NORM, Role.ROUTER, Role.VECTOR):
        return T.F32
    if r.base in (T.IQ4_NL, T.IQ4_XS):
        return iq4_tensor_type(r, t, bp)
    if r.name in LOW_BIT_MIXES:  # issue 23
        return low_bit_type(r, t, bp)
    if r.base is T.MXFP4 and any(is_expert(x) for x in bp.tensors):  # llama.cpp's MXFP4_MOE
        return T.MXFP4 if is_expert(t) else T.Q8_0
    if not r.mixed:
        return r.base
    tied = not any(x.role is Role.OUTPUT for x in bp.tensors)
    if t.role is Role.OUTPUT or (tied and t.role is Role.EMBEDDING):
        return T.Q6_K
    if t.role in (Role.ATTN_V, Role.FFN_DOWN) and t.layer is not None:
        return T.Q6_K if more_bits(t.layer, bp.n_layers) else r.base
    return r.base


def iq4_tensor_type(r: Recipe, t: TensorSpec, bp: Blueprint) -> GGMLQuantizationType:
    """IQ4_NL / IQ4_XS as llama.cpp's quantiser types them: the LM head (the tied embedding
    standing in for it) in Q6_K (Q8_0 when its rows do not fill 256-value blocks), IQ4_XS rows
    that do not fill 256-value blocks in IQ4_NL (a gpt-oss width of 2880, a tiny model's 128),
    every other matrix in the recipe's type (an untied embedding included)."""
    tied = not any(x.role is Role.OUTPUT for x in bp.tensors)
    if t.role is Role.OUTPUT or (tied and t.role is Role.EMBEDDING):
        return T.Q6_K if t.k % 256 == 0 else T.Q8_0
    if r.base == T.IQ4_XS and t.k % 256:
        return T.IQ4_NL
    return r.base


# --- issue 23: the 2- and 3-bit mixes -------------------------------------------------------------

LOW_BIT_MIXES = ("Q2_K", "Q3_K_M")


def gqa_ratio(bp: Blueprint) -> int:
    """Query heads per key-value head (1 when the metadata does not say)."""
    meta = {m.key.split(".", 1)[-1]: m.value for m in bp.metadata}
    heads, kv = meta.get("attention.head_count"), meta.get("attention.head_count_kv")
    if isinstance(heads, int) and isinstance(kv, int) and kv > 0:
        return heads // kv
    return 1


def low_bit_type(r: Recipe, t: TensorSpec, bp: Blueprint) -> GGMLQuantizationType:
    """llama.cpp's rules for these files (its llama-quant.cpp), for the roles we write:
    the LM head (or the tied embedding standing in for it) Q6_K in both;
    Q2_K: attn_v Q4_K when 4 or more query heads share a KV head (else Q3_K), ffn_down and
        attn_output Q3_K, the rest Q2_K;
    Q3_K_M: attn_v Q5_K in the first two blocks and Q4_K after, ffn_down Q5_K in the first
        sixteenth of the blocks and Q4_K after, attn_output Q4_K, the rest Q3_K."""
    tied = not any(x.role is Role.OUTPUT for x in bp.tensors)
    if t.role is Role.OUTPUT or (tied and t.role is Role.EMBEDDING):
        return T.Q6_K
    layer = t.layer if t.layer is not None else 0
    if r.name == "Q2_K":
        if t.role is Role.ATTN_V:
            return T.Q4_K if gqa_ratio(bp) >= 4 else T.Q3_K
        if t.role in (Role.FFN_DOWN, Role.ATTN_OUTPUT):
            return T.Q3_K
        return T.Q2_K
    if t.role is Role.ATTN_V:
        return T.Q5_K if layer < 2 else T.Q4_K
    if t.role is Role.FFN_DOWN:
        return T.Q5_K if layer < bp.n_layers // 16 else T.Q4_K
    if t.role is Role.ATTN_OUTPUT:
        return T.Q4_K
    return T.Q3_K


# --- mixture-of-experts models ---------------------------------------------------------------


def is_expert(t: TensorSpec) -> bool:
    """A merged 3-D expert tensor (ffn_{gate,up,down}_exps: [experts, rows, K])."""
    return len(t.shape) == 3 and t.role in (Role.FFN_GATE, Role.FFN_UP, Role.FFN_DOWN)
