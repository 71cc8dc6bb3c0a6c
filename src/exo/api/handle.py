"""What the HTTP API needs from the node it runs in."""

from collections.abc import Callable
from typing import Protocol

from exo.shared.models.model_cards import ModelCard
from exo.shared.types.chunks import Chunk
from exo.shared.types.commands import Command
from exo.shared.types.common import CommandId, NodeId
from exo.shared.types.state import State
from exo.utils.channels import Receiver


class NodeHandle(Protocol):
    @property
    def node_id(self) -> NodeId: ...

    def state(self) -> State:
        """The latest state this node has applied."""
        ...

    def master_id(self) -> NodeId | None:
        """The master this node follows (itself when alone); None while there is none."""
        ...

    async def wait_for_state(self, predicate: Callable[[State], bool], timeout: float) -> State:
        """Wait until the applied state satisfies ``predicate``; TimeoutError after ``timeout``."""
        ...

    async def send_command(self, command: Command) -> None:
        """Send a command to the master (wherever it is)."""
        ...

    def open_response(self, command_id: CommandId) -> Receiver[Chunk]:
        """Register for the chunks of a command. Call before sending the command. The
        receiver ends after a chunk with a finish reason (an ErrorChunk included)."""
        ...

    def close_response(self, command_id: CommandId) -> None:
        """Stop listening for a command's chunks (the client went away or it finished)."""
        ...

    def model_cards(self) -> list[ModelCard]:
        """The models this node knows how to serve."""
        ...
