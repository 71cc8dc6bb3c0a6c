"""The pure parts: envelopes, replay protection, cluster keys, the zenoh config we build."""

import json
from collections.abc import Callable

import pytest
import zenoh

from exo.routing.config import RoutingConfig, loopback_config, zenoh_config
from exo.routing.envelope import (
    CounterSource,
    Opened,
    Rejection,
    ReplayGuard,
    open_envelope,
    seal,
)
from exo.routing.keys import ClusterKeys, check_name

KEY = b"k" * 32
CONTEXT = "exo/abc/t/events"


def test_sealed_envelope_opens_with_its_sender_session_counter_and_payload() -> None:
    data = seal(KEY, CONTEXT, "node-1", 7, 42, b'{"x":1}')
    assert open_envelope(KEY, CONTEXT, data) == Opened("node-1", 7, 42, b'{"x":1}')


def same(data: bytes) -> bytes:
    return data


def other_payload(data: bytes) -> bytes:
    return data[:-1] + b"]"


def other_sender(data: bytes) -> bytes:
    return data.replace(b"node-1", b"node-2")


def other_session(data: bytes) -> bytes:
    at = data.index(b"node-1") + len(b"node-1")
    return data[:at] + bytes((data[at] ^ 1,)) + data[at + 1 :]


def truncated(data: bytes) -> bytes:
    return data[:20]


def garbage(data: bytes) -> bytes:
    return b"garbage"


def empty(data: bytes) -> bytes:
    return b""


@pytest.mark.parametrize(
    ("key", "context", "mutate", "reason"),
    [
        (b"x" * 32, CONTEXT, same, Rejection.BAD_MAC),
        (KEY, "exo/abc/t/other", same, Rejection.BAD_MAC),
        (KEY, CONTEXT, other_payload, Rejection.BAD_MAC),
        (KEY, CONTEXT, other_sender, Rejection.BAD_MAC),
        (KEY, CONTEXT, other_session, Rejection.BAD_MAC),
        (KEY, CONTEXT, truncated, Rejection.MALFORMED),
        (KEY, CONTEXT, garbage, Rejection.MALFORMED),
        (KEY, CONTEXT, empty, Rejection.MALFORMED),
    ],
)
def test_tampered_envelopes_are_rejected(
    key: bytes, context: str, mutate: Callable[[bytes], bytes], reason: Rejection
) -> None:
    data = seal(KEY, CONTEXT, "node-1", 7, 42, b'{"x":1}')
    assert open_envelope(key, context, mutate(data)) == reason


def test_replay_guard_admits_only_growing_counters_per_sender_and_context() -> None:
    guard = ReplayGuard()
    assert guard.admit("a", "t1", 5)
    assert not guard.admit("a", "t1", 5)
    assert not guard.admit("a", "t1", 4)
    assert guard.admit("a", "t2", 1)
    assert guard.admit("b", "t1", 1)
    assert guard.admit("a", "t1", 6)
    assert guard.admit("a", "t1", 3, session=2)  # another session of a: its own counters
    assert not guard.admit("a", "t1", 3, session=2)


def test_counters_grow_strictly_and_start_from_the_clock() -> None:
    source = CounterSource()
    values = [source.next() for _ in range(1000)]
    assert values == sorted(set(values))
    assert values[0] > 1_600_000_000 * 10**9
    assert source.session != CounterSource().session  # one per process start


def test_secrets_give_independent_prefixes_and_mac_keys() -> None:
    a, b = ClusterKeys.from_secret("alpha"), ClusterKeys.from_secret("beta")
    assert a.prefix != b.prefix and a.mac_key != b.mac_key
    assert a == ClusterKeys.from_secret("alpha")
    assert "alpha" not in a.prefix
    assert a.node_of_alive(a.alive("n1")) == "n1"
    assert a.node_of_alive(b.alive("n1")) is None
    with pytest.raises(ValueError):
        ClusterKeys.from_secret("")


@pytest.mark.parametrize("name", ["", "a/", "/a", "a//b", "a/*", "a/**", "a$b", "a?b", "a#b"])
def test_names_with_wildcards_or_empty_chunks_are_refused(name: str) -> None:
    with pytest.raises(ValueError):
        check_name(name)


def test_node_ids_must_be_one_chunk() -> None:
    with pytest.raises(ValueError):
        loopback_config("a/b", "s")


def test_loopback_config_keeps_zenoh_on_lo() -> None:
    config = zenoh.Config.from_json5(
        json.dumps(zenoh_config(loopback_config("n1", "s", multicast_port=47001)))
    )
    assert json.loads(config.get_json("mode")) == "peer"
    assert json.loads(config.get_json("listen/endpoints")) == ["tcp/127.0.0.1:0"]
    assert json.loads(config.get_json("scouting/multicast/enabled")) is True
    assert json.loads(config.get_json("scouting/multicast/interface")) == "lo"
    assert json.loads(config.get_json("scouting/multicast/address")) == "224.0.0.224:47001"
    assert json.loads(config.get_json("transport/link/tx/lease")) == 1000


def test_multicast_off_means_no_scouting_and_no_scout_replies() -> None:
    config = RoutingConfig(
        node_id="n1",
        secret="s",
        listen=["tcp/127.0.0.1:0"],
        peers=["tcp/127.0.0.1:7447"],
        multicast=False,
        multicast_interface=None,
    )
    assert config.listen == ("tcp/127.0.0.1:0",)
    scouting = zenoh_config(config)["scouting"]
    assert isinstance(scouting, dict)
    assert scouting["multicast"] == {
        "enabled": False,
        "listen": False,
        "address": "224.0.0.224:7446",
        "interface": "auto",
        "ttl": 1,
    }
