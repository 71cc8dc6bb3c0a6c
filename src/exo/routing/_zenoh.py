# zenoh's stubs leave some return types out (undeclare, close, put, ...): tolerated here only.
# pyright: reportUnknownMemberType=false, reportUnknownArgumentType=false
"""The one module that touches zenoh: a small typed surface of bytes, strings and callbacks.

Callbacks run on zenoh's threads; they must return quickly and never raise (an error is
logged here, never lost silently).
"""

import json
from collections.abc import Callable, Mapping
from typing import TypeVar

import zenoh
from loguru import logger

from exo.routing.config import JsonValue

Undeclare = Callable[[], None]
_A = TypeVar("_A")


def _once(undeclare: Undeclare) -> Undeclare:
    done = False

    def call() -> None:
        nonlocal done
        if not done:
            done = True
            undeclare()

    return call


def _guarded(what: str, fn: Callable[[_A], None]) -> Callable[[_A], None]:
    def call(arg: _A) -> None:
        try:
            fn(arg)
        except Exception:
            logger.exception(f"zenoh {what} callback failed")

    return call


class IncomingQuery:
    """A request received by an endpoint: reply once, then finish it."""

    def __init__(self, query: zenoh.Query) -> None:
        self._query = query
        self.key = str(query.key_expr)
        payload = query.payload
        self.payload = payload.to_bytes() if payload is not None else b""
        self._finished = False

    def reply(self, key: str, payload: bytes) -> None:
        self._query.reply(key, payload)

    def finish(self) -> None:
        """Tell zenoh this endpoint is done with the query, so the asker is not kept waiting."""
        if not self._finished:
            self._finished = True
            self._query.drop()


class ZenohSession:
    def __init__(self, config: Mapping[str, JsonValue]) -> None:
        """Open a session (blocking: up to the scouting delay with multicast)."""
        self._mode = str(config.get("mode", "peer"))
        self._session = zenoh.open(zenoh.Config.from_json5(json.dumps(config)))

    def zid(self) -> str:
        return str(self._session.zid())

    def locators(self, timeout_s: float) -> list[str]:
        """The endpoints this session really listens on (port 0 resolved), from the admin space."""
        for reply in self._session.get(f"@/{self.zid()}/{self._mode}", timeout=timeout_s):
            sample = reply.ok
            if sample is not None:
                info: dict[str, list[str]] = json.loads(sample.payload.to_bytes())
                return [str(locator) for locator in info.get("locators", [])]
        raise RuntimeError("zenoh admin space did not report this session's locators")

    def put(self, key: str, payload: bytes) -> None:
        """Publish reliably: blocks while the transmit queue is full instead of dropping."""
        self._session.put(key, payload, congestion_control=zenoh.CongestionControl.BLOCK)

    def subscribe(
        self, key: str, on_sample: Callable[[str, bytes], None], *, include_local: bool
    ) -> Undeclare:
        def callback(sample: zenoh.Sample) -> None:
            on_sample(str(sample.key_expr), sample.payload.to_bytes())

        origin = zenoh.Locality.ANY if include_local else zenoh.Locality.REMOTE
        subscriber = self._session.declare_subscriber(
            key, _guarded("subscriber", callback), allowed_origin=origin
        )
        return _once(subscriber.undeclare)

    def serve(self, key: str, on_query: Callable[[IncomingQuery], None]) -> Undeclare:
        def callback(query: zenoh.Query) -> None:
            on_query(IncomingQuery(query))

        queryable = self._session.declare_queryable(key, _guarded("queryable", callback))
        return _once(queryable.undeclare)

    def query(
        self,
        selector: str,
        payload: bytes,
        *,
        timeout_s: float,
        on_reply: Callable[[bytes], None],
        on_done: Callable[[], None],
    ) -> None:
        """Ask every matching endpoint; ``on_done`` runs once no more replies can come."""

        def callback(reply: zenoh.Reply) -> None:
            result = reply.result
            if isinstance(result, zenoh.Sample):
                on_reply(result.payload.to_bytes())
            else:
                logger.warning(f"zenoh error reply on {selector}: {result.payload.to_bytes()!r}")

        def done() -> None:
            try:
                on_done()
            except Exception:
                logger.exception("zenoh query completion callback failed")

        self._session.get(
            selector,
            zenoh.handlers.Callback(_guarded("reply", callback), done),
            payload=payload,
            timeout=timeout_s,
            target=zenoh.QueryTarget.ALL,
            consolidation=zenoh.ConsolidationMode.NONE,
            congestion_control=zenoh.CongestionControl.BLOCK,
        )

    def declare_token(self, key: str) -> Undeclare:
        return _once(self._session.liveliness().declare_token(key).undeclare)

    def watch_liveliness(self, key: str, on_change: Callable[[str, bool], None]) -> Undeclare:
        """``on_change(key, alive)`` for every token matching ``key``, present ones first."""

        def callback(sample: zenoh.Sample) -> None:
            on_change(str(sample.key_expr), sample.kind == zenoh.SampleKind.PUT)

        subscriber = self._session.liveliness().declare_subscriber(
            key, _guarded("liveliness", callback), history=True
        )
        return _once(subscriber.undeclare)

    def close(self) -> None:
        self._session.close()
