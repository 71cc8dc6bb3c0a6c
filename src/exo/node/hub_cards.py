"""The node's hub wiring for its model registry: building a hub model's card and searching
the hub are the worker's download code; the registry (and through it the API and the
CLI) is given them as plain callables, and sees only ``CardUnavailable``."""

from huggingface_hub import HfApi

from exo.shared.models.embedded import embedded_model_card
from exo.shared.models.model_cards import ModelCard
from exo.shared.models.registry import CardUnavailable, ModelRegistry
from exo.worker.download.cards import card_from_hub, hub_name_problem, parse_model_name
from exo.worker.download.hub import DownloadError, HubSettings


def fetch_hub_card(name: str) -> ModelCard:
    """A hub model's card from its metadata (blocking)."""
    try:
        return card_from_hub(name, HubSettings.from_env())
    except DownloadError as e:
        raise CardUnavailable(e.message, e.status) from e


def search_hub(query: str, limit: int) -> list[str]:
    """Hub repos matching ``query`` (blocking); 503 when the hub is off, None-status when
    it cannot be reached."""
    settings = HubSettings.from_env()
    if settings.offline:
        raise CardUnavailable("the hub cannot be searched: HF_HUB_OFFLINE=1", 503)
    api = HfApi(endpoint=settings.endpoint, token=settings.token or False)
    try:
        return [m.id for m in api.list_models(search=query, limit=limit)]
    except Exception as e:  # the hub client's own errors: connection, HTTP, JSON
        raise CardUnavailable(f"the hub could not be searched: {e}", None) from e


def node_registry(cards: list[ModelCard]) -> ModelRegistry:
    """The node's registry: the embedded model, ``cards``, and the hub behind them."""
    return ModelRegistry(
        [embedded_model_card(), *cards],
        fetch=fetch_hub_card,
        is_hub_name=lambda name: parse_model_name(name) is not None,
        search=search_hub,
        name_problem=hub_name_problem,
    )
