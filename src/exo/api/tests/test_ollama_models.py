"""Ollama's listings tell a model's size in parameters from its weights' bytes and format."""

from exo.api.ollama_models import parameter_count, parameter_size
from exo.shared.models.embedded import embedded_model_card
from exo.shared.tests.builders import model_card
from exo.shared.types.memory import Memory


def test_the_embedded_models_parameters_come_from_its_quantised_bytes() -> None:
    # SmolLM2-135M has 134.5M parameters; its file is Q4_1 with a Q8_0 embedding (96.6 MB):
    # counting 16 bits a weight said 48.3M.
    card = embedded_model_card()
    assert abs(parameter_count(card) - 134.5e6) / 134.5e6 < 0.02
    assert parameter_size(card) == "134.7M"


def test_float_weights_count_their_width() -> None:
    card = model_card().model_copy(
        update={"storage_size": Memory(in_bytes=2_000_000_000), "weight_format": "BF16"}
    )
    assert parameter_size(card) == "1.0B"
