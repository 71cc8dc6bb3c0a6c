"""Random bodies to every POST endpoint: a 4xx or a success, never a 5xx."""

import json
import socket
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exo.api.tests.conftest import ServeFn
from exo.api.tests.scripted_node import ScriptedNode, small_card
from exo.shared.models.embedded import embedded_model_card

# Fields each endpoint reads: fuzzing them (not just random keys) reaches the validators.
ENDPOINTS: dict[str, list[str]] = {
    "/v1/chat/completions": [
        "model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens",
        "temperature", "top_p", "top_k", "min_p", "seed", "stop", "n", "tools",
        "presence_penalty", "frequency_penalty", "repetition_penalty", "tool_choice",
        "response_format", "logprobs", "top_logprobs", "reasoning_effort", "parallel_tool_calls",
    ],
    "/v1/completions": ["model", "prompt", "max_tokens", "stream", "echo", "stop", "seed"],
    "/v1/responses": [
        "model", "input", "instructions", "max_output_tokens", "temperature", "top_p",
        "stream", "tools", "previous_response_id", "tool_choice", "text", "reasoning",
        "top_logprobs", "include", "store",
    ],
    "/v1/messages": [
        "model", "max_tokens", "messages", "system", "stop_sequences", "stream",
        "temperature", "top_p", "top_k", "tools", "tool_choice", "thinking",
    ],
    "/v1/messages/count_tokens": ["model", "messages", "system", "tools"],
    "/api/chat": ["model", "messages", "stream", "options", "format", "tools", "think",
                  "keep_alive", "tool_choice"],
    "/api/generate": ["model", "prompt", "system", "raw", "stream", "options", "format", "images",
                      "think", "keep_alive"],
    "/api/show": ["model", "name"],
    "/v1/embeddings": ["model", "input", "encoding_format", "dimensions"],
    "/api/embed": ["model", "input"],
    "/api/embeddings": ["model", "prompt"],
    "/place_instance": ["model", "sharding", "min_nodes"],
    "/v1/cancel/some-command": [],
}  # fmt: skip

OPTION_KEYS = ["temperature", "top_p", "top_k", "min_p", "seed", "num_predict", "stop",
               "repeat_penalty", "presence_penalty", "frequency_penalty", "num_ctx"]  # fmt: skip

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=10,
)
models = st.sampled_from(["m1", "test-org/model-1", "smollm2", "M1", "m1:latest", "nope", ""])
roles = st.sampled_from(["system", "developer", "user", "assistant", "tool", "bogus"])
parts = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "input_text", "image_url"]), "text": scalars}
)
messages = st.lists(
    st.fixed_dictionaries(
        {
            "role": roles,
            "content": st.one_of(st.text(max_size=10), st.lists(parts, max_size=2), scalars),
        }
    ),
    max_size=3,
)
options = st.fixed_dictionaries({}, optional={k: scalars for k in OPTION_KEYS})
numbers = st.integers(min_value=-5, max_value=10**7) | st.floats(
    min_value=-3, max_value=3, allow_nan=False
)


def field_values(name: str) -> st.SearchStrategy[Any]:
    special: dict[str, st.SearchStrategy[Any]] = {
        "model": models,
        "name": models,
        "messages": messages,
        "input": st.one_of(st.text(max_size=10), messages),
        "options": options,
        "stream": st.booleans(),
        "sharding": st.sampled_from(["pipeline", "tensor", "ring"]),
    }
    return st.one_of(special.get(name, numbers), json_values)


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, bytes]:
    path = draw(st.sampled_from(sorted(ENDPOINTS)))
    shaped = st.fixed_dictionaries({}, optional={key: field_values(key) for key in ENDPOINTS[path]})
    body = draw(st.one_of(shaped, json_values))
    return path, json.dumps(body).encode()


def fuzz_node() -> ScriptedNode:
    # Only models that fit: a model that cannot be placed is an honest 503.
    return ScriptedNode(cards=[embedded_model_card(), small_card("test-org/model-1", ["m1"])])


@pytest.fixture
def http(serve: ServeFn) -> httpx.Client:
    server = serve(fuzz_node(), placement_timeout_s=5.0)
    # No Nagle delay between the request's header and body writes.
    transport = httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
    return httpx.Client(base_url=server.url, timeout=10.0, transport=transport)


def check(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        response.json()  # errors are JSON


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(request=requests())
def test_json_bodies_never_cause_a_server_error(
    http: httpx.Client, request: tuple[str, bytes]
) -> None:
    path, body = request
    check(http.post(path, content=body, headers={"content-type": "application/json"}))


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(path=st.sampled_from(sorted(ENDPOINTS)), body=st.binary(max_size=40))
def test_raw_bytes_never_cause_a_server_error(http: httpx.Client, path: str, body: bytes) -> None:
    check(http.post(path, content=body, headers={"content-type": "application/json"}))
    check(http.post(path, content=b'{"model": NaN, "temperature": Infinity}'))
