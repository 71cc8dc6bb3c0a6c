"""Pure ASGI middleware: API key checks, the request body limit and request metrics."""

import hmac
import os
import time

from loguru import logger
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from exo.api.errors import ApiError, send_error
from exo.api.streaming import CLIENT_CLOSED_REQUEST
from exo.utils import metrics

# Paths that need no API key: health, and the dashboard's page and assets (a browser
# cannot send the key when it loads them; the page asks for it and sends it itself).
OPEN_PATHS = frozenset({"/health", "/"})
OPEN_PREFIXES = ("/dashboard/",)


def is_open(path: str) -> bool:
    return path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)


def presented_key(headers: Headers) -> str | None:
    """The key a client sent: ``Authorization: Bearer KEY`` or ``x-api-key: KEY``."""
    authorization = headers.get("authorization")
    if authorization is not None:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    api_key = headers.get("x-api-key")
    return api_key.strip() if api_key else None


def key_matches(presented: str | None, expected: str) -> bool:
    if presented is None:
        return False
    return hmac.compare_digest(presented.encode(), expected.encode())


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self._app = app
        self._api_key = api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or is_open(str(scope.get("path", ""))):
            await self._app(scope, receive, send)
            return
        presented = presented_key(Headers(scope=scope))
        if not key_matches(presented, self._api_key):
            reason = "missing API key" if presented is None else "invalid API key"
            error = ApiError(
                401,
                f"{reason}: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                code="invalid_api_key",
            )
            await send_error(scope, receive, send, error)
            return
        await self._app(scope, receive, send)


DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024


def max_body_bytes() -> int:
    """The largest request body accepted (``EXO_MAX_BODY_BYTES``, default 8 MiB)."""
    value = os.environ.get("EXO_MAX_BODY_BYTES", "")
    return int(value) if value.isdigit() and int(value) > 0 else DEFAULT_MAX_BODY_BYTES


def _too_large(limit: int) -> ApiError:
    return ApiError(
        413, f"request body too large: the limit is {limit} bytes", code="request_too_large"
    )


class BodySizeLimitMiddleware:
    """Refuses a body over the limit with a 413 before the app reads it whole: at once
    from its Content-Length, or as soon as a chunked body passes the limit."""

    def __init__(self, app: ASGIApp, limit: int | None = None) -> None:
        self._app = app
        self._limit = limit if limit is not None else max_body_bytes()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self._limit:
            await send_error(scope, receive, send, _too_large(self._limit))
            return
        received = 0
        answered = False
        started = False

        async def limited() -> Message:
            nonlocal received, answered
            if answered:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self._limit and not started:
                    # Answer now; to the app the client is gone, and what it sends is dropped.
                    answered = True
                    await send_error(scope, receive, send, _too_large(self._limit))
                    return {"type": "http.disconnect"}
            return message

        async def watch(message: Message) -> None:
            nonlocal started
            if answered:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self._app(scope, limited, watch)
        except Exception as e:
            if not answered:
                raise
            # The app saw the client as gone after our 413: expected, nothing to report.
            logger.debug(f"request body over the limit; the app stopped with {e!r}")


class MetricsMiddleware:
    """Counts requests by route (the template, not the raw path) and status."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        started = time.monotonic()
        status = [CLIENT_CLOSED_REQUEST]

        async def record_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        try:
            await self._app(scope, receive, record_status)
        except BaseException:
            if status[0] == CLIENT_CLOSED_REQUEST:
                status[0] = 500
            raise
        finally:
            endpoint = _endpoint(scope)
            metrics.API_REQUESTS.labels(endpoint=endpoint, status=str(status[0])).inc()
            metrics.API_REQUEST_DURATION.labels(endpoint=endpoint).observe(
                time.monotonic() - started
            )


def _endpoint(scope: Scope) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else "unmatched"
