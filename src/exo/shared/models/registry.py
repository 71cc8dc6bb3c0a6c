"""The one registry of the models a node knows: the embedded default, local files it was
given, and hub models it has built cards for. The node owns it; the API and the CLI are
given it (they never build hub cards themselves).

A name resolves, in order, to a known card (by id or alias, any case), to the card an
instance in the cluster's state already carries (another node placed it: no need to ask
the hub), and only then to a card built from the hub by ``fetch`` (injected: the
worker's hub code; none on a node that cannot reach a hub). Pure apart from ``fetch``."""

from collections.abc import Callable, Iterable

from exo.shared.models import catalogue
from exo.shared.models.model_cards import ModelCard, ModelId
from exo.shared.types.state import State
from exo.shared.types.state_queries import card_in_state


class CardUnavailable(Exception):
    """A hub model's card cannot be built: ``status`` says why (403: gated, 404: no such
    repo or file, 422: a file that is not a model; None: the hub cannot be reached)."""

    def __init__(self, message: str, status: int | None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


FetchCard = Callable[[str], ModelCard]
"""Builds a hub model's card (blocking; raises ``CardUnavailable``)."""


SearchHub = Callable[[str, int], list[str]]
"""Hub repos matching a query, at most so many (blocking; raises ``CardUnavailable``)."""


def _no_hub(name: str) -> ModelCard:
    raise CardUnavailable(f"model {name!r} is not known here and no hub is configured", 404)


def _no_search(_query: str, _limit: int) -> list[str]:
    raise CardUnavailable("no hub is configured", 503)


class ModelRegistry:
    def __init__(
        self,
        cards: Iterable[ModelCard] = (),
        fetch: FetchCard = _no_hub,
        is_hub_name: Callable[[str], bool] = lambda _: False,
        search: SearchHub = _no_search,
        name_problem: Callable[[str], str | None] = lambda _: None,
    ) -> None:
        self._cards: dict[ModelId, ModelCard] = {}
        self._fetch = fetch
        self.search = search
        """Search the hub (blocking: run it in a thread)."""
        self._is_hub_name = is_hub_name
        self.name_problem = name_problem
        """Why a name written like a hub name (it has a '/') is not a valid one (None: it
        is one, or it does not look like one): no retry can help such a request."""
        for card in cards:
            self.add(card)

    def add(self, card: ModelCard) -> None:
        self._cards[card.model_id] = card

    def cards(self) -> list[ModelCard]:
        return list(self._cards.values())

    def resolve(self, name: str, state: State | None = None) -> ModelCard | None:
        """A known card by model id or alias, ignoring case; else the card an instance
        of that model in ``state`` carries (None: neither)."""
        wanted = name.strip().lower()
        for card in self._cards.values():
            if card.model_id.lower() == wanted or wanted in (a.lower() for a in card.aliases):
                return card
        if state is None:
            return None
        for model_id in {i.shard_assignments.model_id for i in state.instances.values()}:
            if model_id.lower() == wanted:
                return card_in_state(state, model_id)
        return None

    def hub_name(self, name: str) -> str | None:
        """The hub repo a name stands for (a catalogue alias, or ``org/repo[:QUANT]``);
        None: not a hub name."""
        in_catalogue = catalogue.hub_name(name)
        if in_catalogue is not None:
            return in_catalogue
        return name if self._is_hub_name(name) else None

    def fetch(self, name: str) -> ModelCard:
        """The card of a hub model, built from the hub (blocking: run it in a thread) and
        remembered; a catalogue alias is kept as an alias of the card."""
        hub = self.hub_name(name) or name  # the fetcher says what is wrong with a name
        card = self._fetch(hub)
        if hub != name:
            card = card.model_copy(update={"aliases": [*card.aliases, name.strip().lower()]})
        self.add(card)
        return card
