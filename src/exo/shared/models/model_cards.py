"""Model cards: what placement and the engine need to know about a model."""

from collections.abc import Mapping
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
    # Bytes of the weights in the model's files (the quantised bytes for a GGUF file): what a
    # node downloads, and with weight_format what the weights take once loaded.
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
    # Size of one attention head; None: hidden_size // num_heads (Qwen3 and Gemma 3 differ).
    head_dim: int | None = None
    # The format of the layer matrices in the file, which decides their running size: a GGUF
    # type ("Q4_K", "Q8_0", "F16"), a GGUF quant label ("Q4_K_M"), or a safetensors dtype
    # ("BF16"); "" when unknown (placement then counts the file's bytes).
    weight_format: str = ""
    # Bytes in the file of the token embedding and of the output head (head 0: tied to the
    # embedding; both 0: unknown, then every layer is counted an equal share of the file).
    # Pipeline rank 0 holds the embedding and the last rank the head (the embedding again when
    # tied); every tensor-parallel rank holds both whole.
    embedding_bytes: int = 0
    head_bytes: int = 0
    # Bytes in the file of each layer (n_layers entries), when read from the files: layers of
    # one model can differ a lot (DeepSeek's dense first layers are far lighter than its MoE
    # layers), so placement splits and sizes shards by these. Empty: every layer is counted an
    # equal share of the file less the embedding and head.
    layer_bytes: list[int] = []
    # Cache bytes of one position over all layers (float32) when the attention kind does not
    # cache num_kv_heads keys and values of head_dim (MLA caches one latent shared by every
    # head, and every tensor rank holds it whole). 0: 2 x num_kv_heads x head_dim per layer,
    # split over tensor ranks by kv heads.
    kv_bytes_per_token: int = 0
    # Mixture-of-experts models: routed experts per MoE layer and those each token runs (0:
    # dense). storage_size counts every expert (every one is held in memory); active_params
    # is what a token reads (total_params: all of them; both 0: unknown).
    n_experts: int = 0
    experts_per_token: int = 0
    total_params: int = 0
    active_params: int = 0
    # The model takes images: its config has a vision tower (``vision_config``), or its GGUF
    # repository carries the vision projector (an ``mmproj`` file).
    vision: bool = False
    # Vision models: bytes of the tower and projector as the first pipeline stage's runner
    # holds them, and the working memory of encoding one image (0: no tower, or not known).
    vision_bytes: int = 0
    vision_activation_bytes: int = 0

    @property
    def attention_head_dim(self) -> int:
        if self.head_dim is not None:
            return self.head_dim
        return self.hidden_size // max(self.num_heads, 1)


def config_takes_images(config: Mapping[str, object]) -> bool:
    """A transformers config with a vision tower (``vision_config``: Gemma 3, Qwen-VL...)."""
    return isinstance(config.get("vision_config"), dict)


def is_mmproj(path: str) -> bool:
    """A GGUF file of llama.cpp's multimodal projector (the vision tower of a GGUF model)."""
    name = path.rsplit("/", 1)[-1].lower()
    return name.endswith(".gguf") and "mmproj" in name
