"""Model cards for model files a user names on the command line (GGUF or HF folder)."""

from pathlib import Path

from exo.shared.models.model_cards import ModelCard, ModelId
from exo.shared.types.memory import Memory

_BYTES_PER_PARAM = 2  # the engine holds weights in 16-bit floats by default


def card_from_path(path: Path) -> ModelCard:
    """Read the model's shape from its metadata. Raises ValueError with a clear message."""
    from exo.worker.engines.engine import load_config

    if not path.exists():
        raise ValueError(f"model file not found: {path}")
    try:
        c = load_config(path)
    except Exception as e:
        raise ValueError(f"cannot read model metadata from {path}: {e}") from e
    kv_dim = c.kv_heads * c.head_dim
    q_dim = c.heads * c.head_dim
    per_layer = c.hidden * q_dim * 2 + c.hidden * kv_dim * 2 + 3 * c.hidden * c.ffn
    embeddings = c.vocab * c.hidden * (1 if c.tie_embeddings else 2)
    params = c.n_layers * per_layer + embeddings
    name = path.name.removesuffix(".gguf") if path.is_file() else path.name
    return ModelCard(
        model_id=ModelId(name),
        n_layers=c.n_layers,
        hidden_size=c.hidden,
        num_heads=c.heads,
        num_kv_heads=c.kv_heads,
        storage_size=Memory(in_bytes=params * _BYTES_PER_PARAM),
        context_length=c.context_length,
        architecture=c.architecture,
        source=str(path.resolve()),
        aliases=[name.lower()],
        chat_template=c.chat_template,
    )
