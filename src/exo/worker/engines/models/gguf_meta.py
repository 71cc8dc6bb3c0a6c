"""Reading a GGUF file's metadata: typed keys, the fields every family's config shares, the
mixture-of-experts keys, and the rotary scaling llama.cpp stores.

A shard file (one pipeline stage's tensors) lists the whole model's tensors and shapes
(`GGUFFile.model_shapes`): the readers here look there, never at the tensors the file holds,
so a stage without the embedding or block 0 reads the same model as the whole file."""

from typing import TypedDict

from exo.worker.engines.config import RopeScaling
from exo.worker.engines.gguf_reader import GGUFFile, MetadataValue, eos_token_ids

Meta = dict[str, MetadataValue]


def get(meta: Meta, key: str) -> MetadataValue:
    if key not in meta:
        raise ValueError(f"GGUF metadata lacks {key!r}")
    return meta[key]


def meta_int(meta: Meta, key: str, default: int | None = None) -> int:
    value = meta.get(key, default) if default is not None else get(meta, key)
    if not isinstance(value, int):
        raise ValueError(f"GGUF metadata {key!r} should be an integer, got {value!r}")
    return value


def meta_float(meta: Meta, key: str, default: float) -> float:
    value = meta.get(key, default)
    if not isinstance(value, int | float):
        raise ValueError(f"GGUF metadata {key!r} should be a number, got {value!r}")
    return float(value)


def rope_scaling(meta: Meta, arch: str) -> RopeScaling | None:
    kind = meta.get(f"{arch}.rope.scaling.type")
    factor = meta_float(meta, f"{arch}.rope.scaling.factor", 1.0)
    if kind == "linear" and factor != 1.0:
        return RopeScaling(kind="linear", factor=factor)
    if kind not in (None, "none", "linear"):
        raise ValueError(f"rope scaling {kind!r} is not supported")
    return None  # llama3-style scaling ships as the `rope_freqs.weight` tensor instead


class BaseFields(TypedDict):
    """The `LlamaConfig` fields every family reads from the same keys."""

    architecture: str
    n_layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    rope_theta: float
    rms_eps: float
    vocab: int
    context_length: int
    tie_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    chat_template: str | None


def base_fields(
    f: GGUFFile, arch: str, *, rope_theta: float = 10000.0, rms_eps: float = 1e-5,
    context_length: int = 4096, ffn_required: bool = True,
) -> BaseFields:
    """The shared fields of `f`'s model (`arch`'s keys; the keyword arguments are the defaults
    of keys a file may leave out; a family whose width is its experts' reads `ffn` itself)."""
    meta, shapes = f.metadata, f.model_shapes
    hidden = meta_int(meta, f"{arch}.embedding_length")
    heads = meta_int(meta, f"{arch}.attention.head_count")
    template, bos = meta.get("tokenizer.chat_template"), meta.get("tokenizer.ggml.bos_token_id")
    if "token_embd.weight" not in shapes:
        raise ValueError("the GGUF file has no token_embd.weight tensor")
    return BaseFields(
        architecture=arch,
        n_layers=meta_int(meta, f"{arch}.block_count"),
        hidden=hidden,
        ffn=meta_int(meta, f"{arch}.feed_forward_length", None if ffn_required else 0),
        heads=heads,
        kv_heads=meta_int(meta, f"{arch}.attention.head_count_kv", heads),
        head_dim=meta_int(meta, f"{arch}.attention.key_length", hidden // heads),
        rope_theta=meta_float(meta, f"{arch}.rope.freq_base", rope_theta),
        rms_eps=meta_float(meta, f"{arch}.attention.layer_norm_rms_epsilon", rms_eps),
        vocab=shapes["token_embd.weight"][0],
        context_length=meta_int(meta, f"{arch}.context_length", context_length),
        tie_embeddings="output.weight" not in shapes,
        bos_token_id=bos if isinstance(bos, int) else None,
        eos_token_ids=eos_token_ids(meta),
        chat_template=template if isinstance(template, str) else None,
    )


class MoeFields(TypedDict):
    """The `MoeConfig` fields of llama.cpp's expert keys."""

    first_k_dense_replace: int
    n_experts: int
    experts_per_token: int
    n_shared_experts: int
    expert_ffn: int
    n_group: int
    topk_group: int
    routed_scaling: float
    norm_topk_prob: bool
    shared_ffn: int


def moe_fields(meta: Meta, arch: str, *, norm_topk_prob: bool) -> MoeFields:
    """The expert keys of `arch` (`norm_topk_prob`: the family's default when the file does
    not say whether the chosen experts' weights are renormalised)."""
    shared = meta_int(meta, f"{arch}.expert_shared_count", 0)
    expert_ffn = meta_int(meta, f"{arch}.expert_feed_forward_length", 0)
    return MoeFields(
        first_k_dense_replace=meta_int(meta, f"{arch}.leading_dense_block_count", 0),
        n_experts=meta_int(meta, f"{arch}.expert_count", 0),
        experts_per_token=meta_int(meta, f"{arch}.expert_used_count", 0),
        n_shared_experts=shared,
        expert_ffn=expert_ffn,
        n_group=meta_int(meta, f"{arch}.expert_group_count", 1),
        topk_group=meta_int(meta, f"{arch}.expert_group_used_count", 1),
        routed_scaling=meta_float(meta, f"{arch}.expert_weights_scale", 1.0),
        norm_topk_prob=bool(meta.get(f"{arch}.expert_weights_norm", norm_topk_prob)),
        shared_ffn=shared * expert_ffn,
    )
