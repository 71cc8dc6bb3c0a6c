"""A stopping node: the requests open then get an error that says why, and a request that
comes after is refused at once with the same words (an HTTP 503), not left waiting on a node
whose tasks are being cancelled (it got a plain-text 500 after a second)."""

from typing import cast

import anyio
import pytest

from exo.api.errors import ApiError
from exo.main import Node
from exo.node.chunks import ChunkRouter
from exo.node.requests import RequestsEnded, RequestTracker
from exo.shared.tests.builders import COMMAND_1
from exo.shared.types.chunks import ErrorChunk
from exo.shared.types.common import CommandId

MESSAGE = "the node is shutting down (SIGTERM)"


def test_end_all_fails_the_open_requests_and_refuses_new_ones() -> None:
    tracker = RequestTracker(ChunkRouter())
    receivers = [tracker.open(COMMAND_1), tracker.open(CommandId())]
    anyio.run(lambda: tracker.end_all(MESSAGE, grace_s=0.0))
    for receiver in receivers:
        chunk = receiver.receive_nowait()
        assert isinstance(chunk, ErrorChunk) and chunk.error_message == MESSAGE
    with pytest.raises(RequestsEnded, match=r"shutting down \(SIGTERM\)"):
        tracker.open(CommandId())


def test_a_request_after_the_end_is_a_503_naming_why() -> None:
    tracker = RequestTracker(ChunkRouter())
    anyio.run(lambda: tracker.end_all(MESSAGE, grace_s=0.0))  # no request was open
    node = cast(Node, type("StoppingNode", (), {"requests": tracker})())
    with pytest.raises(ApiError) as refused:
        Node.open_response(node, CommandId())
    assert refused.value.status == 503 and MESSAGE in str(refused.value)
