"""Model cards: what placement and the engine need to know about a model."""

from typing import Any, Literal

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

from exo.shared.types.common import FrozenModel
from exo.shared.types.memory import Memory


class ModelId(str):
    """The public name of a model, e.g. ``HuggingFaceTB/SmolLM2-135M-Instruct``."""

    __slots__ = ()

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(
            cls,
            core_schema.str_schema(min_length=1),
            serialization=core_schema.plain_serializer_function_ser_schema(str),
        )


ModelTask = Literal["text_generation"]


class HubFile(FrozenModel):
    """One file of a hub repo, as the hub reports it."""

    path: str
    size: int
    sha256: str | None = None
    """The LFS sha256 (weights); None for small files kept in git."""


class HubSource(FrozenModel):
    """Where a model comes from on the Hugging Face hub, pinned to one commit so that
    every node of an instance downloads the same revision."""

    repo_id: str
    revision: str
    files: list[HubFile]
    """The files a node may need: weights (for GGUF, the chosen quant only), config,
    tokenizer and chat template."""
    gguf_quant: str | None = None
    size_estimated: bool = False
    """True when the byte sizes are estimates (built offline), not the hub's."""


class ModelCard(FrozenModel):
    model_id: ModelId
    n_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    storage_size: Memory
    context_length: int
    architecture: str
    tasks: list[ModelTask] = ["text_generation"]
    # Where the weights live on nodes that have them: a GGUF file or a safetensors folder
    # (the embedded model's names its file inside its package; each worker finds its copy).
    # Empty for models a node would have to download.
    source: str = ""
    aliases: list[str] = []
    # Set for models fetched from the Hugging Face hub.
    hub: HubSource | None = None
    # The model's own chat template (Jinja), read by whoever built the card from the model's
    # files or the hub; None when it has none or it was not read. The API shows it (Ollama
    # /api/show) and never reads model files itself.
    chat_template: str | None = None
