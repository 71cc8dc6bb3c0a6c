"""Delivers response chunks to the API requests waiting for them on this node."""

import math

from anyio import ClosedResourceError, WouldBlock
from loguru import logger

from exo.shared.types.chunks import Chunk, ErrorChunk
from exo.shared.types.common import CommandId
from exo.utils.channels import Receiver, Sender, channel


class ChunkRouter:
    def __init__(self) -> None:
        self._open: dict[CommandId, Sender[Chunk]] = {}

    def open(self, command_id: CommandId) -> Receiver[Chunk]:
        sender, receiver = channel[Chunk](math.inf)
        self._open[command_id] = sender
        return receiver

    def close(self, command_id: CommandId) -> None:
        sender = self._open.pop(command_id, None)
        if sender is not None:
            sender.close()

    def is_open(self, command_id: CommandId) -> bool:
        return command_id in self._open

    def open_commands(self) -> list[CommandId]:
        return list(self._open)

    def deliver(self, command_id: CommandId, chunk: Chunk) -> None:
        """Hand a chunk to its request; the stream ends after a chunk with a finish reason."""
        sender = self._open.get(command_id)
        if sender is None:
            return  # nobody is listening (any more): drop it
        try:
            sender.send_nowait(chunk)
        except (ClosedResourceError, WouldBlock):
            logger.debug(f"response {command_id} went away; chunk dropped")
            self.close(command_id)
            return
        if chunk.finish_reason is not None:
            self.close(command_id)

    def fail(self, command_id: CommandId, chunk: ErrorChunk) -> None:
        self.deliver(command_id, chunk)
