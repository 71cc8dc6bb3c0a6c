"""The node's one model registry: known cards, then the card an instance in the state
already carries, and only then the hub (through the fetcher the node injects)."""

import pytest

from exo.shared.models.model_cards import ModelCard, ModelId
from exo.shared.models.registry import CardUnavailable, ModelRegistry
from exo.shared.tests.builders import (
    INSTANCE_1,
    NODE_B,
    RUNNER_B1,
    make_state,
    model_card,
    pipeline_instance,
)

REMOTE = ModelId("other-org/placed-elsewhere")


class _Hub:
    """A stand-in for the worker's hub code: counts what it is asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def fetch(self, name: str) -> ModelCard:
        self.asked.append(name)
        if "/" not in name:
            raise CardUnavailable(f"{name!r} is not a hub name (org/repo)", 400)
        return model_card(ModelId(name.split(":")[0]))


def _registry(hub: _Hub) -> ModelRegistry:
    local = model_card().model_copy(update={"aliases": ["m1"]})
    return ModelRegistry([local], fetch=hub.fetch, is_hub_name=lambda n: "/" in n)


def test_a_known_card_by_id_or_alias_in_any_case() -> None:
    registry = _registry(_Hub())
    card = registry.resolve("M1")
    assert card is not None and card.model_id == "test-org/model-1"
    assert registry.resolve("TEST-ORG/model-1") == card
    assert registry.resolve("nope") is None


def test_the_card_an_instance_carries_is_used_before_the_hub() -> None:
    hub = _Hub()
    registry = _registry(hub)
    card = model_card(REMOTE)
    state = make_state(instances=[pipeline_instance(INSTANCE_1, [(NODE_B, RUNNER_B1)], card=card)])
    assert registry.resolve(REMOTE) is None  # not known here
    assert registry.resolve(REMOTE.upper(), state) == card
    assert hub.asked == []


def test_a_hub_card_is_fetched_once_and_remembered() -> None:
    hub = _Hub()
    registry = _registry(hub)
    card = registry.fetch("some-org/some-model")
    assert hub.asked == ["some-org/some-model"]
    assert registry.resolve("some-org/some-model") == card
    assert card in registry.cards()


def test_a_catalogue_alias_is_kept_on_the_fetched_card() -> None:
    hub = _Hub()
    registry = _registry(hub)
    card = registry.fetch("llama-3.2-1b")
    assert hub.asked == ["meta-llama/Llama-3.2-1B-Instruct"]
    assert "llama-3.2-1b" in card.aliases
    assert registry.resolve("llama-3.2-1b") == card


def test_the_fetcher_says_what_is_wrong_with_a_name() -> None:
    hub = _Hub()
    registry = _registry(hub)
    assert registry.hub_name("plainname") is None
    with pytest.raises(CardUnavailable) as caught:
        registry.fetch("plainname")
    assert caught.value.status == 400
    assert registry.resolve("plainname") is None


def test_a_registry_without_a_hub_says_so() -> None:
    with pytest.raises(CardUnavailable, match="no hub"):
        ModelRegistry(is_hub_name=lambda _: True).fetch("org/model")
