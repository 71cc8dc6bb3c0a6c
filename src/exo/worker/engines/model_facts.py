"""What a model card needs from a model's files, read from their headers only: the shape, the
bytes of all weights as stored, and the format of the layer matrices (which decides their
running size: `exo.shared.models.memory.running_weight_bytes`)."""

from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from exo.worker.engines.config import LlamaConfig, MoeConfig, check_context_length
from exo.worker.engines.file_rows import SAFETENSORS_DTYPES, SafetensorsFile
from exo.worker.engines.gguf_loader import gguf_config
from exo.worker.engines.gguf_reader import GGUFFile
from exo.worker.engines.models.deepseek2_files import DeepseekConfig
from exo.worker.engines.models.mla import kv_bytes_per_token as mla_kv_bytes
from exo.worker.engines.safetensors_loader import canonical_name, hf_config


@dataclass(frozen=True)
class ModelFacts:
    config: LlamaConfig
    weight_bytes: int
    """Bytes of every tensor in the file(s), as stored."""
    weight_format: str
    """The format holding most bytes of the layer matrices: a GGUF type name ("Q4_K",
    "Q8_0", "F16") or a safetensors dtype ("BF16")."""
    embedding_bytes: int
    """Bytes of the token embedding."""
    head_bytes: int
    """Bytes of the output head; 0 when it is tied to the embedding."""
    layer_bytes: tuple[int, ...] = ()
    """Bytes of each layer's tensors as stored (n_layers entries)."""
    kv_bytes_per_token: int = 0
    """Cache bytes of one position over all layers (float32) for an attention kind whose
    cache is not keys and values of the kv heads (MLA's latent); 0 otherwise."""
    n_experts: int = 0
    """Routed experts per MoE layer (0: a dense model)."""
    experts_per_token: int = 0
    """Experts each token runs through (0: a dense model)."""
    total_params: int = 0
    """Parameters of every layer matrix, embedding and head (all experts counted)."""
    active_params: int = 0
    """Parameters a token reads: as `total_params` with only `experts_per_token` experts."""


def _attention_params(c: LlamaConfig) -> int:
    """One layer's attention matrices: q, k, v, o of the heads, or MLA's down and up
    projections (q LoRA, the latent's, Wkvb, Wo)."""
    d = c.hidden
    if not isinstance(c, DeepseekConfig):
        return d * c.head_dim * (2 * c.heads + 2 * c.kv_heads)
    m = c.mla_dims()
    qk = m.heads * (m.qk_nope + m.qk_rope)
    q = d * qk if m.q_lora_rank is None else m.q_lora_rank * (d + qk)
    latent = d * m.latent + m.kv_lora_rank * m.heads * (m.qk_nope + m.v_head_dim)
    return q + latent + m.heads * m.v_head_dim * d


def parameter_counts(c: LlamaConfig) -> tuple[int, int]:
    """(total, active per token) parameters of the matrices, embedding and head (norms, biases
    and routers' small vectors aside; routers counted)."""
    d = c.hidden
    attention = _attention_params(c)
    embed = c.vocab * d * (1 if c.tie_embeddings else 2)
    total = active = embed
    for i in range(c.n_layers):
        if isinstance(c, MoeConfig) and c.is_moe(i):
            fixed = attention + c.n_experts * d + 3 * d * c.shared_ffn
            total += fixed + 3 * d * c.expert_ffn * c.n_experts
            active += fixed + 3 * d * c.expert_ffn * c.experts_per_token
        else:
            total += attention + 3 * d * c.ffn
            active += attention + 3 * d * c.ffn
    return total, active


def _with_counts(facts: "ModelFacts") -> "ModelFacts":
    c = facts.config
    total, active = parameter_counts(c)
    moe = isinstance(c, MoeConfig)
    return replace(
        facts,
        n_experts=c.n_experts if moe else 0,
        experts_per_token=c.experts_per_token if moe else 0,
        total_params=total,
        active_params=active,
    )


def model_facts(path: Path) -> ModelFacts:
    """The facts of a GGUF file or a Hugging Face safetensors folder. ValueError for a model a
    card cannot offer (a declared context above 2^24 positions)."""
    facts = _folder_facts(path) if path.is_dir() else _gguf_facts(path)
    check_context_length(facts.config.context_length)
    return _with_counts(facts)


def kv_bytes_per_token(config: LlamaConfig) -> int:
    """Float32 cache bytes of a position over all layers for MLA models (their latent); 0 for
    the others (keys and values of the kv heads: the card's heads say how many)."""
    if isinstance(config, DeepseekConfig):
        return mla_kv_bytes(config.n_layers, config.mla_dims(), 4)
    return 0


def _layer_of(name: str, prefix: str) -> int | None:
    """The layer number of a tensor named `prefix`N.rest (None for other tensors)."""
    if not name.startswith(prefix):
        return None
    number = name[len(prefix) :].split(".", 1)[0]
    return int(number) if number.isdigit() else None


def _per_layer(sizes: dict[str, int], prefix: str, n_layers: int) -> tuple[int, ...]:
    per = [0] * n_layers
    for name, size in sizes.items():
        i = _layer_of(name, prefix)
        if i is not None and i < n_layers:  # (a GLM file's extra prediction block: not a layer)
            per[i] += size
    return tuple(per)


def _gguf_facts(path: Path) -> ModelFacts:
    f = GGUFFile(path)
    try:
        config = gguf_config(f)
        matrices: Counter[str] = Counter()
        for name, info in f.tensors.items():
            if name.startswith("blk.") and len(info.shape) >= 2:  # (3-D: merged experts)
                matrices[info.qtype.name] += info.n_bytes
        total = sum(t.n_bytes for t in f.tensors.values())
        head = f.tensors.get("output.weight")
        embedding = f.tensors["token_embd.weight"].n_bytes
        sizes = {name: info.n_bytes for name, info in f.tensors.items()}
        return ModelFacts(
            config, total, _most(matrices), embedding, head.n_bytes if head else 0,
            _per_layer(sizes, "blk.", config.n_layers), kv_bytes_per_token(config),
        )  # fmt: skip
    finally:
        f.close()


def _folder_facts(folder: Path) -> ModelFacts:
    config = hf_config(folder)
    total = embedding = head = 0
    matrices: Counter[str] = Counter()
    sizes: dict[str, int] = {}
    for file in sorted(folder.glob("*.safetensors")):
        st = SafetensorsFile(file)
        try:
            for name, info in st.tensors.items():
                n = 1
                for d in info.shape:
                    n *= d
                size = n * SAFETENSORS_DTYPES.get(info.dtype, (None, 4))[1]
                total += size
                sizes[canonical_name(name)] = size
                if ".layers." in name and len(info.shape) >= 2:
                    matrices[info.dtype] += size
                elif name.endswith("embed_tokens.weight"):
                    embedding = size
                elif name.endswith("lm_head.weight"):
                    head = size
        finally:
            st.close()
    layers = _per_layer(sizes, "model.layers.", config.n_layers)
    return ModelFacts(
        config, total, _most(matrices), embedding, head, layers, kv_bytes_per_token(config)
    )


def _most(counts: Counter[str]) -> str:
    return counts.most_common(1)[0][0] if counts else ""
