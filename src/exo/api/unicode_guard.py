"""Refuses JSON bodies whose strings hold a lone UTF-16 surrogate (``"\\ud800"``).

JSON may spell one (an unpaired ``\\udXXX`` escape) and Python's ``json`` decodes it, but
such a string is not Unicode text: the node can neither encode it to UTF-8 nor send it to
the cluster. The request is a client error (400, in the API's own error shape), found
before any route sees the body. Only bodies that could hold one (an escape of the
surrogate range, or its raw bytes) are parsed here; pairs (an emoji written as two
escapes) are fine.
"""

import json
import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from exo.api.errors import ApiError, send_error

# An escape of the surrogate range, or the UTF-8-like bytes of a surrogate (ED A0..BF).
_MAYBE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate_at(value: object) -> str | None:
    """Where (``messages.0.content``) a decoded JSON value holds a lone surrogate; walked
    with a stack of its own, so any depth ``json`` decodes is fine."""
    stack: list[tuple[str, object]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return path or "body"
        elif isinstance(item, dict):
            for key, sub in reversed(list(item.items())):  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
                where = f"{path}.{key}" if path else str(key)  # pyright: ignore[reportUnknownArgumentType]
                stack.extend([(where, sub), (where, key)])
        elif isinstance(item, list):
            for i in range(len(item) - 1, -1, -1):  # pyright: ignore[reportUnknownArgumentType]
                stack.append((f"{path}.{i}" if path else str(i), item[i]))  # pyright: ignore[reportUnknownArgumentType]
    return None


def body_error(body: bytes) -> ApiError | None:
    """The 400 for a body with a lone surrogate; None for any other body (not JSON
    included: the route reports that)."""
    if not _MAYBE.search(body):
        return None
    try:
        value: object = json.loads(body)
    except (ValueError, RecursionError):  # the route reports it
        return None
    where = lone_surrogate_at(value)
    if where is None:
        return None
    return ApiError(
        400,
        f"{where}: the text holds a lone UTF-16 surrogate (such as \\ud800), "
        "which is not valid Unicode",
        param=where,
        code="invalid_unicode",
    )


async def _read_body(receive: Receive) -> tuple[bytes, list[Message]]:
    """The whole body, and the messages it came in (to replay them to the app)."""
    messages: list[Message] = []
    body = b""
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return body, messages
        body += message.get("body", b"")
        if not message.get("more_body", False):
            return body, messages


class UnicodeGuard:
    """Pure ASGI middleware: bodies with a lone surrogate are a 400."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self._app(scope, receive, send)
            return
        body, messages = await _read_body(receive)
        error = body_error(body)
        if error is not None:
            await send_error(scope, receive, send, error)
            return
        pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]
        if messages and messages[-1]["type"] != "http.request":
            pending.append(messages[-1])  # the client left while sending

        async def replay() -> Message:
            return pending.pop(0) if pending else await receive()

        await self._app(scope, replay, send)
