"""Typed names on the network: a Topic carries one message type, an Endpoint a request
type and a reply type. Both encode as JSON through a pydantic TypeAdapter, so a topic
may carry a model class or any type a TypeAdapter accepts (e.g. a tagged union)."""

from dataclasses import dataclass
from typing import Generic, TypeVar

from pydantic import TypeAdapter

from exo.routing.keys import check_name

T = TypeVar("T")
Req = TypeVar("Req")
Rep = TypeVar("Rep")


def _adapter(model: type[T] | TypeAdapter[T]) -> TypeAdapter[T]:
    return model if isinstance(model, TypeAdapter) else TypeAdapter(model)


class Topic(Generic[T]):
    """``Topic("events", Event)`` or ``Topic("events", TypeAdapter(EventUnion))``."""

    def __init__(self, name: str, model: type[T] | TypeAdapter[T]) -> None:
        self.name = check_name(name)
        self.adapter: TypeAdapter[T] = _adapter(model)

    def encode(self, message: T) -> bytes:
        return self.adapter.dump_json(message)

    def decode(self, data: bytes) -> T:
        """Raises pydantic.ValidationError on bytes that are not a valid message."""
        return self.adapter.validate_json(data)

    def __repr__(self) -> str:
        return f"Topic({self.name!r})"


class Endpoint(Generic[Req, Rep]):
    """A request/reply service: ``Endpoint("log", LogRequest, LogPage)``."""

    def __init__(
        self, name: str, request: type[Req] | TypeAdapter[Req], reply: type[Rep] | TypeAdapter[Rep]
    ) -> None:
        self.name = check_name(name)
        self.request: Topic[Req] = Topic(name, request)
        self.reply: Topic[Rep] = Topic(name, reply)

    def __repr__(self) -> str:
        return f"Endpoint({self.name!r})"


@dataclass(frozen=True)
class Delivery(Generic[T]):
    """A received message with its authenticated sender (a holder of the cluster secret)."""

    sender: str
    message: T
