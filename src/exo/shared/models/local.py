"""Model cards for model files a user names on the command line (GGUF or HF folder)."""

from pathlib import Path

from exo.shared.models.model_cards import ModelCard, ModelId
from exo.shared.types.memory import Memory


def card_from_path(path: Path) -> ModelCard:
    """Read the model's shape from its metadata. Raises ValueError with a clear message."""
    from exo.worker.engines.model_facts import model_facts

    if not path.exists():
        raise ValueError(f"model file not found: {path}")
    try:
        facts = model_facts(path)
    except Exception as e:
        raise ValueError(f"cannot read model metadata from {path}: {e}") from e
    c = facts.config
    name = path.name.removesuffix(".gguf") if path.is_file() else path.name
    return ModelCard(
        model_id=ModelId(name),
        n_layers=c.n_layers,
        hidden_size=c.hidden,
        num_heads=c.heads,
        num_kv_heads=c.kv_heads,
        storage_size=Memory(in_bytes=facts.weight_bytes),
        context_length=c.context_length,
        architecture=c.architecture,
        source=str(path.resolve()),
        aliases=[name.lower()],
        chat_template=c.chat_template,
        head_dim=c.head_dim,
        weight_format=facts.weight_format,
        embedding_bytes=facts.embedding_bytes,
        head_bytes=facts.head_bytes,
    )
