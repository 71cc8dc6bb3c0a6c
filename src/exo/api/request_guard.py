"""Who may drive the node over HTTP: DNS rebinding, cross-site requests, lax bodies.

A node without an API key trusts whoever can reach it, which by default is this machine
only. A web page in a local browser can still reach it: through a rebound DNS name (the
``Host`` header then names the attacker's domain) or with a cross-site request (the
``Origin`` header names the page). ``RequestGuard`` refuses both: ``Host`` must be a
localhost name or one of the node's own addresses, and a request that carries an
``Origin`` must come from the node itself or from an origin allowed by ``--cors-origin``.

Ollama's documented curl examples send JSON bodies without a JSON content type. Such a
body on ``/api/...`` is read as JSON, but only when the request carries no ``Origin``: a
browser page may send a "simple" (non-JSON) POST cross-site without a preflight.
"""

import ipaddress
import socket
from collections.abc import Iterable
from email.message import Message as EmailMessage

import psutil
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from exo.api.errors import ApiError, send_error

_LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
_WILDCARDS = frozenset({"", "0.0.0.0", "::"})


def split_host(host_header: str) -> str:
    """The host of a ``Host`` value (``name:port``, ``[v6]:port``), lower case."""
    value = host_header.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value[1:]
    if value.count(":") == 1:
        return value.split(":", 1)[0]
    return value


def is_local_name(host: str) -> bool:
    if host in _LOCAL_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def machine_addresses() -> frozenset[str]:
    """This machine's interface addresses and names (for an API bound to every address)."""
    names: set[str] = set()
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family in (socket.AF_INET, socket.AF_INET6):
                names.add(address.address.split("%", 1)[0].lower())
    hostname = socket.gethostname().lower()
    names.update({hostname, f"{hostname}.local"})
    return frozenset(names)


def own_hosts(api_host: str) -> frozenset[str]:
    """The host names a request to this node may carry besides localhost names."""
    host = split_host(api_host)
    if host in _WILDCARDS:
        return machine_addresses()
    return frozenset({host})


def is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    message = EmailMessage()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


class RequestGuard:
    def __init__(self, app: ASGIApp, api_host: str, cors_origins: Iterable[str]) -> None:
        self._app = app
        self._hosts = own_hosts(api_host)
        self._origins = frozenset(o.rstrip("/").lower() for o in cors_origins)

    def host_allowed(self, host_header: str | None) -> bool:
        if host_header is None:  # HTTP/1.0 without Host: not a browser
            return True
        host = split_host(host_header)
        return is_local_name(host) or host in self._hosts

    def origin_allowed(self, origin: str, host_header: str | None) -> bool:
        origin = origin.rstrip("/").lower()
        if origin in self._origins or "*" in self._origins:
            return True
        # Same origin: a page served by this node (the dashboard).
        if host_header is None:
            return False
        return origin in (f"http://{host_header.lower()}", f"https://{host_header.lower()}")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        host = headers.get("host")
        origin = headers.get("origin")
        error: ApiError | None = None
        if not self.host_allowed(host):
            error = ApiError(
                403,
                f"host {host!r} is not this node: use its address or localhost",
                code="forbidden_host",
            )
        elif origin is not None and not self.origin_allowed(origin, host):
            error = ApiError(
                403,
                f"origin {origin!r} is not allowed: start the node with --cors-origin {origin}",
                code="forbidden_origin",
            )
        elif _ollama_post(scope) and not is_json(headers.get("content-type")):
            if origin is not None:
                error = ApiError(
                    415,
                    "send the request body with 'Content-Type: application/json'",
                    code="unsupported_media_type",
                )
            else:
                scope = _with_json_content_type(scope)
        if error is not None:
            await send_error(scope, receive, send, error)
            return
        await self._app(scope, receive, send)


def _ollama_post(scope: Scope) -> bool:
    return str(scope.get("path", "")).startswith("/api/") and scope.get("method") == "POST"


def _with_json_content_type(scope: Scope) -> Scope:
    raw: list[tuple[bytes, bytes]] = [
        (k, v) for k, v in scope["headers"] if k.lower() != b"content-type"
    ]
    raw.append((b"content-type", b"application/json"))
    return {**scope, "headers": raw}
