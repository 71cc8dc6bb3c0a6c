"""The models a node knows: the embedded default and any local files it was given."""

from collections.abc import Iterable

from exo.shared.models.embedded import embedded_model_card
from exo.shared.models.model_cards import ModelCard, ModelId


class ModelRegistry:
    def __init__(self, cards: Iterable[ModelCard] = ()) -> None:
        self._cards: dict[ModelId, ModelCard] = {}
        for card in cards:
            self.add(card)

    @classmethod
    def default(cls) -> "ModelRegistry":
        return cls([embedded_model_card()])

    def add(self, card: ModelCard) -> None:
        self._cards[card.model_id] = card

    def cards(self) -> list[ModelCard]:
        return list(self._cards.values())

    def resolve(self, name: str) -> ModelCard | None:
        """A card by model id or alias, ignoring case."""
        wanted = name.strip().lower()
        for card in self._cards.values():
            if card.model_id.lower() == wanted or wanted in (a.lower() for a in card.aliases):
                return card
        return None
