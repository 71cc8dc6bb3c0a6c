"""Identifiers and the frozen base model every message type derives from."""

from typing import Any, Self
from uuid import uuid4

from pydantic import BaseModel, ConfigDict, GetCoreSchemaHandler
from pydantic_core import core_schema


class FrozenModel(BaseModel):
    """Immutable, strict, no extra fields: the base of every message and state type."""

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")


class Id(str):
    """A string identifier; calling the class with no argument makes a fresh unique id."""

    __slots__ = ()

    def __new__(cls, value: str | None = None) -> Self:
        if value is None:
            value = uuid4().hex
        if not value:
            raise ValueError(f"{cls.__name__} must not be empty")
        return super().__new__(cls, value)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str.__repr__(self)})"

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(
            cls,
            core_schema.str_schema(min_length=1),
            serialization=core_schema.plain_serializer_function_ser_schema(str),
        )


class NodeId(Id):
    __slots__ = ()


class CommandId(Id):
    __slots__ = ()
