"""Quantisation recipes: which GGML type each tensor of a file gets.

A plain recipe (`Q4_0`, `Q8_0`, `Q6_K`, `F16`, `BF16`...) stores every matrix in that type;
`Q4_K_M` / `Q5_K_M` follow llama.cpp's mixes: the LM head (or the tied embedding standing in
for it) in Q6_K, attn_v and ffn_down in Q6_K in the first and last eighth of the blocks and in
every third block between, everything else in Q4_K / Q5_K. Norms are always F32.
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


# --- mixture-of-experts models ---------------------------------------------------------------


def is_expert(t: TensorSpec) -> bool:
    """A merged 3-D expert tensor (ffn_{gate,up,down}_exps: [experts, rows, K])."""
    return len(t.shape) == 3 and t.role in (Role.FFN_GATE, Role.FFN_UP, Role.FFN_DOWN)
