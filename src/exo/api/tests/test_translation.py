"""Requests to task parameters and events to response objects, with plain values."""

import json
from typing import Any

import pytest
from pydantic import ValidationError

from exo.api import claude, ollama, openai_chat, openai_completions, openai_responses
from exo.api.errors import ApiError, ApiFamily, claude_error_type, error_body, validation_error
from exo.api.generation_events import Failed, Finished, TextDelta, Timings
from exo.api.management import choose_preview
from exo.api.tests.scripted_node import small_card
from exo.api.tests.test_images import data_url, image_bytes
from exo.master.placement import PlacementPreview
from exo.shared.types.chunks import Usage
from exo.shared.types.common import CommandId
from exo.shared.types.text_generation import InputMessage

PNG = image_bytes("PNG")

CARD = small_card("test-org/model-1")
CID = CommandId("cmd1")
TIMINGS = Timings(accepted_ns=0, sent_ns=1_000, first_token_ns=3_000, finished_ns=10_000)
USAGE = Usage(prompt_tokens=4, completion_tokens=2)


def finished(reason: Any = "stop", stop: str | None = None) -> Finished:
    return Finished(reason=reason, usage=USAGE, timings=TIMINGS, stop_sequence=stop)


def sse_events(pieces: list[bytes]) -> list[tuple[str | None, Any]]:
    """(event name, parsed data) for each server-sent event."""
    out: list[tuple[str | None, Any]] = []
    for block in b"".join(pieces).decode().split("\n\n"):
        if not block:
            continue
        event: str | None = None
        data = ""
        for line in block.split("\n"):
            if line.startswith("event: "):
                event = line[len("event: ") :]
            elif line.startswith("data: "):
                data = line[len("data: ") :]
        out.append((event, data if data == "[DONE]" else json.loads(data)))
    return out


# ---------------------------------------------------------------- OpenAI chat


def test_chat_maps_every_sampling_parameter() -> None:
    request = openai_chat.ChatCompletionRequest.model_validate(
        {
            "model": "m1",
            "messages": [
                {"role": "developer", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ],
            "max_completion_tokens": 7,
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 40,
            "min_p": 0.05,
            "seed": 3,
            "stop": "END",
            "presence_penalty": 0.1,
            "frequency_penalty": -0.2,
            "repetition_penalty": 1.1,
        }
    )
    params = openai_chat.chat_task_params(request, CARD)
    assert params.input == [
        InputMessage(role="system", content="be brief"),
        InputMessage(role="user", content="a\nb"),
    ]
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k) == (7, 0.5, 0.9, 40)
    assert (params.min_p, params.seed, params.stop) == (0.05, 3, ["END"])
    assert (params.presence_penalty, params.frequency_penalty) == (0.1, -0.2)
    assert params.repetition_penalty == 1.1
    assert params.model == CARD.model_id


def test_chat_caps_max_tokens_at_the_context_and_reads_top_p_zero_as_greedy() -> None:
    request = openai_chat.ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 10**9,
            "top_p": 0,
        }
    )
    params = openai_chat.chat_task_params(request, CARD)
    assert params.max_tokens == CARD.context_length
    assert (params.top_p, params.top_k) == (1.0, 1)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"temperature": 2.5}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"n": 17}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"messages": []}, "messages"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages.0.content",
        ),
        ({"tools": [{"type": "function"}]}, "tools.0.function"),
        ({"stop": 5}, "stop"),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ],
)
def test_chat_rejects_bad_values_naming_the_parameter(body: dict[str, Any], param: str) -> None:
    base: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    with pytest.raises(ValidationError) as info:
        openai_chat.ChatCompletionRequest.model_validate({**base, **body})
    error = validation_error(info.value.errors())
    assert error.status == 400
    assert error.param == param
    assert error.message.startswith(param)


def test_chat_stream_encoder_emits_role_deltas_finish_usage_and_done() -> None:
    encoder = openai_chat.ChatStreamEncoder(CID, "model", 123, include_usage=True)
    pieces = encoder.begin(4) + encoder.encode(TextDelta("hi")) + encoder.encode(finished("length"))
    events = [data for _, data in sse_events(pieces)]
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[1]["choices"][0]["delta"] == {"content": "hi"}
    assert events[2]["choices"][0]["finish_reason"] == "length"
    assert events[3]["choices"] == [] and events[3]["usage"]["total_tokens"] == 6
    assert events[4] == "[DONE]"
    assert {e["id"] for e in events[:4]} == {"chatcmpl-cmd1"}


def test_chat_stream_error_is_an_openai_error_object() -> None:
    encoder = openai_chat.ChatStreamEncoder(CID, "model", 123, include_usage=False)
    [(_, data)] = sse_events(encoder.encode(Failed("runner died")))
    assert data["error"]["message"] == "runner died"
    assert data["error"]["type"] == "server_error"


def test_chat_completion_object() -> None:
    body = openai_chat.chat_completion(CID, "model", 5, [("text", finished("stop_sequence", "x"))])
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "text"}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}


def test_cancel_accepts_derived_ids() -> None:
    assert openai_chat.command_id_of("chatcmpl-abc") == "abc"
    assert openai_chat.command_id_of("resp_abc") == "abc"
    assert openai_chat.command_id_of("abc") == "abc"


# ---------------------------------------------------------------- OpenAI responses


def test_responses_input_string_and_instructions() -> None:
    request = openai_responses.ResponsesRequest.model_validate(
        {"model": "m", "input": "hello", "instructions": "sys", "max_output_tokens": 9}
    )
    params = openai_responses.responses_task_params(request, CARD)
    assert params.input == [
        InputMessage(role="system", content="sys"),
        InputMessage(role="user", content="hello"),
    ]
    assert params.max_tokens == 9


def test_responses_input_items_with_parts() -> None:
    request = openai_responses.ResponsesRequest.model_validate(
        {
            "model": "m",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "q"}]},
                {"type": "message", "role": "assistant", "content": "a"},
            ],
        }
    )
    params = openai_responses.responses_task_params(request, CARD)
    assert [m.role for m in params.input] == ["user", "assistant"]


def test_responses_stream_sequence_is_ordered_and_numbered() -> None:
    request = openai_responses.ResponsesRequest.model_validate({"model": "m", "input": "x"})
    shape = openai_responses.ResponseShape(CID, request, "model", 1.0)
    encoder = openai_responses.ResponsesStreamEncoder(shape)
    pieces = encoder.begin(4) + encoder.encode(TextDelta("a")) + encoder.encode(finished())
    events = sse_events(pieces)
    assert [name for name, _ in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [data["sequence_number"] for _, data in events] == list(range(9))
    assert all(name == data["type"] for name, data in events)
    final = events[-1][1]["response"]
    assert final["status"] == "completed"
    assert final["output"][0]["content"][0]["text"] == "a"
    assert final["usage"]["output_tokens"] == 2


def test_responses_length_is_incomplete_and_failure_is_failed() -> None:
    request = openai_responses.ResponsesRequest.model_validate({"model": "m", "input": "x"})
    shape = openai_responses.ResponseShape(CID, request, "model", 1.0)
    whole = openai_responses.whole_response(shape, "t", finished("length"))
    assert whole["status"] == "incomplete"
    assert whole["incomplete_details"] == {"reason": "max_output_tokens"}
    encoder = openai_responses.ResponsesStreamEncoder(shape)
    [(name, data)] = sse_events(encoder.encode(Failed("boom")))
    assert name == "response.failed"
    assert data["response"]["error"]["message"] == "boom"


# ---------------------------------------------------------------- Claude


def test_claude_system_blocks_stop_sequences_and_sampling() -> None:
    request = claude.MessagesRequest.model_validate(
        {
            "model": "m",
            "max_tokens": 20,
            "system": [{"type": "text", "text": "s1"}, {"type": "text", "text": "s2"}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "stop_sequences": ["\n\nHuman:"],
            "temperature": 0.3,
            "top_k": 5,
        }
    )
    params = claude.messages_task_params(request, CARD)
    assert params.input == [
        InputMessage(role="system", content="s1\ns2"),
        InputMessage(role="user", content="hi"),
    ]
    assert (params.max_tokens, params.stop, params.temperature, params.top_k) == (
        20,
        ["\n\nHuman:"],
        0.3,
        5,
    )


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"temperature": 1.5}, "temperature"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "user", "content": [{"type": "video"}]}]}, "messages.0.content.0"),
    ],
)
def test_claude_rejects_bad_values(body: dict[str, Any], param: str) -> None:
    base: dict[str, Any] = {
        "model": "m",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "x"}],
    }
    merged = {**base, **body}
    if merged.get("max_tokens") is None:
        del merged["max_tokens"]
    with pytest.raises(ValidationError) as info:
        claude.MessagesRequest.model_validate(merged)
    assert validation_error(info.value.errors()).param == param


def test_claude_stream_events_and_stop_reasons() -> None:
    encoder = claude.MessagesStreamEncoder(CID, "model")
    pieces = (
        encoder.begin(4)
        + encoder.encode(TextDelta("a"))
        + encoder.encode(finished("stop_sequence", "X"))
    )
    events = sse_events(pieces)
    assert [name for name, _ in events] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    delta = events[5][1]
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "X"}
    assert delta["usage"] == {"input_tokens": 4, "output_tokens": 2}
    assert claude.stop_reason("length") == "max_tokens"
    assert claude.stop_reason("stop") == "end_turn"
    [(name, data)] = sse_events(encoder.encode(Failed("boom")))
    assert name == "error"
    assert data == {"type": "error", "error": {"type": "api_error", "message": "boom"}}


# ---------------------------------------------------------------- Ollama


def test_ollama_options_map_to_task_params() -> None:
    request = ollama.ChatRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "options": {
                "num_predict": 12,
                "repeat_penalty": 1.2,
                "stop": ["a", "b"],
                "temperature": 0,
                "seed": 42,
                "min_p": 0.1,
                "num_ctx": 4096,
            },
        }
    )
    params = ollama.chat_task_params(request, CARD)
    assert (params.max_tokens, params.repetition_penalty, params.stop) == (12, 1.2, ["a", "b"])
    assert (params.temperature, params.seed, params.min_p) == (0.0, 42, 0.1)
    assert request.stream is True  # Ollama streams unless told not to


def test_ollama_unlimited_num_predict_and_raw_generate() -> None:
    request = ollama.GenerateRequest.model_validate(
        {"model": "m", "prompt": "p", "raw": True, "options": {"num_predict": -1}}
    )
    params = ollama.generate_task_params(request, CARD)
    assert params.max_tokens is None
    assert params.raw_prompt == "p"


@pytest.mark.parametrize(
    "options", [{"num_predict": 0}, {"temperature": -1}, {"top_p": 2}, {"repeat_penalty": 0}]
)
def test_ollama_rejects_bad_options(options: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as info:
        ollama.GenerateRequest.model_validate({"model": "m", "prompt": "p", "options": options})
    param = validation_error(info.value.errors()).param
    assert param is not None and param.startswith("options.")


def test_ollama_final_object_has_counts_and_durations() -> None:
    encoder = ollama.OllamaStreamEncoder("generate", "model", lambda: "2024-01-01T00:00:00Z")
    [line] = encoder.encode(finished("length"))
    final = json.loads(line)
    assert final["done"] is True and final["done_reason"] == "length"
    assert (final["prompt_eval_count"], final["eval_count"]) == (4, 2)
    assert final["total_duration"] == 10_000
    assert final["load_duration"] == 1_000
    assert final["prompt_eval_duration"] == 2_000
    assert final["eval_duration"] == 7_000
    [error] = encoder.encode(Failed("boom"))
    assert json.loads(error) == {"error": "boom"}


# ---------------------------------------------------------------- shared


def test_validation_error_messages() -> None:
    assert validation_error([{"type": "json_invalid", "loc": ("body", 3), "msg": "x"}]).message
    missing = validation_error([{"type": "missing", "loc": ("body",), "msg": "Field required"}])
    assert missing.message == "a JSON request body is required"
    wrong = validation_error([{"type": "model_attributes_type", "loc": ("body",), "msg": "x"}])
    assert wrong.message == "the request body must be a JSON object"


def test_choose_preview_takes_the_fewest_nodes_or_says_why() -> None:
    valid = PlacementPreview(sharding="pipeline", node_count=2, valid=True)
    invalid = PlacementPreview(sharding="pipeline", node_count=1, valid=False, reason="too big")
    assert choose_preview([invalid, valid], "pipeline", 1) == valid
    reason = choose_preview([invalid], "pipeline", 1)
    assert isinstance(reason, str) and "too big" in reason
    assert "cluster has 1" in str(choose_preview([invalid], "pipeline", 3))
    assert isinstance(choose_preview([valid], "tensor", 1), str)


def test_build_task_params_names_the_clients_parameter() -> None:
    from exo.api.task_params import Sampling, build_task_params

    with pytest.raises(ApiError) as info:
        build_task_params(
            CARD,
            [InputMessage(role="user", content="x")],
            Sampling(repetition_penalty=-1.0),
            stream=False,
            names={"repetition_penalty": "options.repeat_penalty"},
        )
    assert info.value.param == "options.repeat_penalty"
    with pytest.raises(ApiError):
        build_task_params(CARD, [], Sampling(), stream=False)


def test_claude_images_are_a_400_naming_vision() -> None:
    request = claude.MessagesRequest.model_validate(
        {
            "model": "m",
            "max_tokens": 5,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image", "source": {"type": "url", "url": data_url(PNG)}}],
                }
            ],
        }
    )
    with pytest.raises(ApiError) as info:
        claude.messages_task_params(request, CARD)
    assert info.value.status == 400 and "vision" in info.value.message
    assert f"{CARD.model_id} does not take images" in info.value.message


def test_completions_take_the_same_sampling_parameters_as_chat() -> None:
    sampling = {
        "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 3, "stop": "END",
        "presence_penalty": 0.1, "frequency_penalty": -0.2, "repetition_penalty": 1.1,
    }  # fmt: skip
    chat = openai_chat.chat_task_params(
        openai_chat.ChatCompletionRequest.model_validate(
            {"model": "m1", "messages": [{"role": "user", "content": "x"}], "max_tokens": 7}
            | sampling
        ),
        CARD,
    )
    completion = openai_completions.completion_task_params(
        openai_completions.CompletionRequest.model_validate(
            {"model": "m1", "prompt": "x", "max_tokens": 7, **sampling}
        ),
        CARD,
    )
    fields = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
              "presence_penalty", "frequency_penalty", "repetition_penalty")  # fmt: skip
    assert [getattr(completion, f) for f in fields] == [getattr(chat, f) for f in fields]
    assert completion.top_k == 40 and completion.repetition_penalty == 1.1


def test_error_types_follow_each_apis_names_for_a_status() -> None:
    claude = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
              404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
              500: "api_error", 503: "overloaded_error", 507: "api_error"}  # fmt: skip
    assert {status: claude_error_type(status) for status in claude} == claude
    openai = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
              413: "invalid_request_error", 429: "rate_limit_error", 503: "server_error"}  # fmt: skip
    for status, kind in openai.items():
        assert error_body(ApiFamily.OPENAI, status, "x")["error"]["type"] == kind


def test_response_formats_become_the_schema_the_output_is_held_to() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}

    def chat(response_format: dict[str, Any]) -> str | None:
        request = openai_chat.ChatCompletionRequest.model_validate(
            {
                "model": "m1",
                "messages": [{"role": "user", "content": "x"}],
                "response_format": response_format,
            }
        )
        return openai_chat.chat_task_params(request, CARD).json_schema

    def responses(text_format: dict[str, Any]) -> str | None:
        request = openai_responses.ResponsesRequest.model_validate(
            {"model": "m1", "input": "x", "text": {"format": text_format}}
        )
        return openai_responses.responses_task_params(request, CARD).json_schema

    assert chat({"type": "text"}) is None and responses({"type": "text"}) is None
    assert chat({"type": "json_object"}) == responses({"type": "json_object"})
    assert json.loads(chat({"type": "json_object"}) or "")["type"] == "object"
    named = {"name": "n", "schema": schema}
    assert json.loads(chat({"type": "json_schema", "json_schema": named}) or "") == schema
    assert json.loads(responses({"type": "json_schema", **named}) or "") == schema
    with pytest.raises(ApiError) as caught:
        chat({"type": "json_schema"})
    assert caught.value.status == 400 and caught.value.param == "response_format"
