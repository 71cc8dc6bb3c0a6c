"""Fetching http(s) image URLs, for a node that allows it (``image_url_fetch``; off by
default: a node that fetches whatever URL a client names is a door into its network).

An ASGI middleware in front of the JSON APIs: it finds the image URLs in a request's body
(OpenAI chat's ``image_url.url``, Responses' ``input_image.image_url``, Claude's url
``source``), fetches them at once within a size and time limit, and puts each in the body as a
data URL (Claude: a base64 source), so the adapters decode them as if sent inline. A failed
fetch is a 400 in the API's own error shape naming the URL.
"""

import base64
import json
from typing import Any, cast

import anyio
import httpx
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from exo.api.errors import ApiError, send_error
from exo.api.images import MAX_IMAGE_BYTES, MEDIA_TYPES

PATHS = frozenset({"/v1/chat/completions", "/v1/responses", "/v1/messages"})


def _is_remote(url: object) -> bool:
    return isinstance(url, str) and url.startswith(("http://", "https://"))


def _slots(body: object) -> list[tuple[dict[str, Any], str, str]]:
    """Every remote image in the body: (the dict holding it, its key, the URL)."""
    found: list[tuple[dict[str, Any], str, str]] = []
    stack: list[object] = [body]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(cast(list[object], node))
        elif isinstance(node, dict):
            d = cast(dict[str, Any], node)
            kind = d.get("type")
            inner = d.get("image_url")
            if kind == "image_url" and isinstance(inner, dict):
                holder = cast(dict[str, Any], inner)
                if _is_remote(holder.get("url")):
                    found.append((holder, "url", holder["url"]))
            elif kind in ("image_url", "input_image") and _is_remote(inner):
                found.append((d, "image_url", cast(str, inner)))
            elif kind == "url" and _is_remote(d.get("url")):
                found.append((d, "source", d["url"]))
            stack.extend(d.values())
    return found


class ImageFetcher:
    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float) -> None:
        self._app = app
        self._max_bytes = min(max_bytes, MAX_IMAGE_BYTES)
        self._timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in PATHS:
            await self._app(scope, receive, send)
            return
        raw = await _read_body(receive)
        try:
            body = await self._fetched(raw)
        except ApiError as error:
            await send_error(scope, _replay(b"", receive), send, error)
            return
        headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await self._app({**scope, "headers": headers}, _replay(body, receive), send)

    async def _fetched(self, raw: bytes) -> bytes:
        try:
            body = json.loads(raw)
        except ValueError:
            return raw  # the app answers a body that is not JSON
        slots = _slots(body)
        if not slots:
            return raw
        fetched: dict[str, tuple[str, bytes] | ApiError] = {}
        client = httpx.AsyncClient(timeout=self._timeout_s, follow_redirects=True)
        async with client, anyio.create_task_group() as tg:
            for url in sorted({url for _, _, url in slots}):
                tg.start_soon(self._fetch, client, url, fetched)
        for holder, key, url in slots:
            result = fetched[url]
            if isinstance(result, ApiError):
                raise result
            media, data = result
            text = base64.b64encode(data).decode()
            if key == "source":
                holder.clear()
                holder.update({"type": "base64", "data": text})
                if media:
                    holder["media_type"] = media
            else:
                holder[key] = f"data:{media};base64,{text}"
        return json.dumps(body).encode()

    async def _fetch(
        self, client: httpx.AsyncClient, url: str, out: dict[str, tuple[str, bytes] | ApiError]
    ) -> None:
        try:
            out[url] = await self._get(client, url)
        except ApiError as e:
            out[url] = e

    async def _get(self, client: httpx.AsyncClient, url: str) -> tuple[str, bytes]:
        """The image's media type (\"\" when not one we read: the bytes decide) and bytes."""
        try:
            with anyio.fail_after(self._timeout_s):
                async with client.stream("GET", url) as r:
                    if r.status_code != 200:
                        raise ApiError(400, f"image URL {url}: the server answered {r.status_code}")
                    data = bytearray()
                    async for chunk in r.aiter_bytes():
                        data += chunk
                        if len(data) > self._max_bytes:
                            raise ApiError(
                                400, f"image URL {url}: larger than {self._max_bytes} bytes"
                            )
                    media = r.headers.get("content-type", "").split(";")[0].strip()
        except TimeoutError as e:
            raise ApiError(400, f"image URL {url}: not fetched within {self._timeout_s} s") from e
        except httpx.HTTPError as e:
            raise ApiError(400, f"image URL {url}: cannot be fetched ({e})") from e
        return (media if media in MEDIA_TYPES else "", bytes(data))


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(cast(bytes, message.get("body", b"")))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, then: Receive) -> Receive:
    """The body once, then the client's own messages (its disconnect)."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return await then()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive
