"""Delivers response chunks to the API requests waiting for them on this node."""

import math

from anyio import ClosedResourceError, WouldBlock
from loguru import logger

from exo.shared.types.chunks import Chunk, TokenChunk, error_chunk
from exo.shared.types.common import CommandId
from exo.utils.channels import Receiver, Sender, channel


class ChunkRouter:
    """One channel per open request. A runner numbers its chunks from 0: a number that skips
    ahead means chunks were lost on the way (a cut cluster link drops them silently), and the
    request ends with an error at once instead of an answer with a hole in it."""

    def __init__(self) -> None:
        self._open: dict[CommandId, Sender[Chunk]] = {}
        self._next_idx: dict[CommandId, int] = {}

    def open(self, command_id: CommandId) -> Receiver[Chunk]:
        sender, receiver = channel[Chunk](math.inf)
        self._open[command_id] = sender
        self._next_idx[command_id] = 0
        return receiver

    def close(self, command_id: CommandId) -> None:
        self._next_idx.pop(command_id, None)
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
        if isinstance(chunk, TokenChunk):
            expected = self._next_idx.get(command_id, 0)
            if chunk.idx < expected:
                logger.debug(f"response {command_id}: chunk {chunk.idx} again; dropped")
                return
            if chunk.idx > expected:
                lost = chunk.idx - expected
                logger.warning(f"response {command_id}: {lost} chunk(s) lost in transit")
                chunk = error_chunk(
                    f"{lost} part(s) of the answer were lost on the way from the node "
                    "that ran it (a cluster link dropped them)"
                )
            else:
                self._next_idx[command_id] = expected + 1
        try:
            sender.send_nowait(chunk)
        except (ClosedResourceError, WouldBlock):
            logger.debug(f"response {command_id} went away; chunk dropped")
            self.close(command_id)
            return
        if chunk.finish_reason is not None:
            self.close(command_id)
