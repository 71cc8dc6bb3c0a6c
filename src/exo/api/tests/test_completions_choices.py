"""Legacy completions' choices over a scripted node: list prompts (strings and token ids),
``n``, ``best_of``, the legacy logprobs object, the bounds and logit_bias's checks."""

from typing import Any

import httpx
import openai
import pytest

from exo.api.completions_choices import Answer, best, logprobs_object, parse_prompts
from exo.api.generation_events import Finished, Timings
from exo.api.tests.scripted_node import PROMPT_TOKENS, TEXT, TOKENS, ScriptedNode, ServedApp
from exo.api.tool_models import logprob_json
from exo.shared.types.chunks import EchoedPrompt, TokenLogprob, TopLogprob, Usage


def oa(server: ServedApp) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=10)


def test_list_prompts_get_n_choices_each_prompt_major(
    server: ServedApp, node: ScriptedNode
) -> None:
    whole = oa(server).completions.create(
        model="m1", prompt=["One", "Two"], n=2, max_tokens=50, seed=7
    )
    assert [c.index for c in whole.choices] == [0, 1, 2, 3]
    assert all(c.text == TEXT for c in whole.choices)
    sent = [g.task_params for g in node.generations[-4:]]
    assert [p.raw_prompt for p in sent] == ["One", "One", "Two", "Two"]
    assert [p.seed for p in sent] == [7, 8, 7, 8]  # the choices of a prompt differ
    assert whole.usage is not None
    assert whole.usage.prompt_tokens == 2 * PROMPT_TOKENS  # each prompt counts once
    assert whole.usage.completion_tokens == 4 * len(TOKENS)


def test_token_id_prompts_are_sent_as_ids(server: ServedApp, node: ScriptedNode) -> None:
    for prompt, expected in (([1, 2, 3], [[1, 2, 3]]), ([[4, 5], [6]], [[4, 5], [6]])):
        reply = oa(server).completions.create(model="m1", prompt=prompt, max_tokens=3)
        assert len(reply.choices) == len(expected)
        sent = [g.task_params for g in node.generations[-len(expected) :]]
        assert [p.prompt_ids for p in sent] == expected
        assert all(p.raw_prompt is None for p in sent)


def test_streamed_choices_carry_their_index(server: ServedApp) -> None:
    chunks = list(oa(server).completions.create(model="m1", prompt=["a", "b"], n=2, stream=True))
    texts: dict[int, str] = {}
    for chunk in chunks:
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    assert texts == {i: TEXT for i in range(4)}


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"logprobs": 6}, "logprobs"),
        ({"n": 9}, "n"),
        ({"best_of": 9}, "best_of"),
        ({"n": 3, "best_of": 2}, "best_of"),
        ({"best_of": 2, "stream": True}, "best_of"),
        ({"echo": True, "logprobs": 1, "stream": True}, "echo"),
        ({"prompt": ["x"] * 9, "best_of": 8}, "prompt"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"logit_bias": {"5": 101}}, "logit_bias.5"),
        ({"logit_bias": {"five": 1}}, "logit_bias.five.[key]"),
        ({"logit_bias": {"-3": 1}}, "logit_bias.-3.[key]"),
    ],
)
def test_out_of_bounds_is_a_400_naming_the_parameter(
    shared_server: ServedApp, extra: dict[str, Any], param: str
) -> None:
    body = {"model": "m1", "prompt": "x", **extra}
    r = httpx.post(f"{shared_server.url}/v1/completions", json=body, timeout=10)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_logit_bias_reaches_the_task_from_chat_and_completions(
    server: ServedApp, node: ScriptedNode
) -> None:
    oa(server).completions.create(model="m1", prompt="x", logit_bias={"5": -100, "9": 3})
    assert node.generations[-1].task_params.logit_bias == {5: -100.0, 9: 3.0}
    messages: Any = [{"role": "user", "content": "x"}]
    oa(server).chat.completions.create(model="m1", messages=messages, logit_bias={"7": 100})
    assert node.generations[-1].task_params.logit_bias == {7: 100.0}
    # an empty or null map: no bias
    oa(server).chat.completions.create(model="m1", messages=messages, logit_bias={})
    assert node.generations[-1].task_params.logit_bias == {}
    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": "m1", "messages": messages, "logit_bias": None},
        timeout=10,
    )
    assert r.status_code == 200 and node.generations[-1].task_params.logit_bias == {}


def _entry(token: str, logprob: float, *top: tuple[str, float]) -> TokenLogprob:
    return TokenLogprob(
        token=token, logprob=logprob, top=[TopLogprob(token=t, logprob=v) for t, v in top]
    )


def test_legacy_logprobs_object_with_the_echoed_prompt_first() -> None:
    echo = EchoedPrompt(
        text="Hi there",
        tokens=["Hi", " there"],
        logprobs=[_entry(" there", -2.0, (" you", -1.0), (" there", -2.0))],
    )
    out = logprobs_object([_entry("!", -0.5, ("!", -0.5))], 0, echo)
    assert out == {
        "tokens": ["Hi", " there", "!"],
        "token_logprobs": [None, -2.0, -0.5],
        "top_logprobs": [None, {" you": -1.0, " there": -2.0}, {"!": -0.5}],
        "text_offset": [0, 2, 8],
    }
    # without echo the offsets count from the end of the prompt
    assert logprobs_object([_entry("!", -0.5)], 8)["text_offset"] == [8]


def _answer(text: str, *logprobs: float) -> Answer:
    timings = Timings(0, 0, None, 0)
    finished = Finished(
        reason="length",
        usage=Usage(prompt_tokens=1, completion_tokens=len(logprobs)),
        timings=timings,
        logprobs=tuple(_entry("t", v) for v in logprobs),
    )
    return Answer("p", text, finished)


def test_best_of_keeps_the_highest_cumulative_logprob() -> None:
    answers = [_answer("a", -1.0, -1.0), _answer("b", -0.1, -0.2), _answer("c", -3.0)]
    assert [a.text for a in best(answers, 2)] == ["b", "a"]
    assert [a.text for a in best(answers, 3)] == ["a", "b", "c"]


def test_prompt_shapes() -> None:
    assert parse_prompts("x") == ["x"]
    assert parse_prompts(["x", "y"]) == ["x", "y"]
    assert parse_prompts([1, 2]) == [[1, 2]]
    assert parse_prompts([[1], [2, 3]]) == [[1], [2, 3]]
    for bad in ("", [""], [], [1, "a"], [[1], "a", []], {"a": 1}):
        with pytest.raises(ValueError):
            parse_prompts(bad)


def test_a_character_split_over_tokens_shows_as_bytes_and_offsets_count_characters() -> None:
    """é (c3 a9) in two tokens: each one's text alone is U+FFFD. The legacy object shows them
    as OpenAI does ("bytes:\\xc3"), their offsets are the character they belong to, and
    chat's entries carry the real bytes (which join into the text)."""
    first = TokenLogprob(
        token="\ufffd", logprob=-1.0, token_bytes=[0xC3],
        top=[TopLogprob(token="\ufffd", logprob=-1.0, token_bytes=[0xC3]),
             TopLogprob(token="e", logprob=-2.0)],
    )  # fmt: skip
    second = TokenLogprob(token="\ufffd", logprob=-0.5, token_bytes=[0xA9])
    out = logprobs_object([first, second, _entry("!", -0.1)], 3)
    assert out["tokens"] == ["bytes:\\xc3", "bytes:\\xa9", "!"]
    assert out["top_logprobs"][0] == {"bytes:\\xc3": -1.0, "e": -2.0}
    assert out["text_offset"] == [3, 3, 4]
    echo = EchoedPrompt(
        text="café", tokens=["caf", "\ufffd", "\ufffd"], token_bytes=[None, [0xC3], [0xA9]]
    )
    with_echo = logprobs_object([_entry("!", -0.1)], 0, echo)
    assert with_echo["tokens"] == ["caf", "bytes:\\xc3", "bytes:\\xa9", "!"]
    assert with_echo["text_offset"] == [0, 3, 3, 4]
    chat = [logprob_json(e) for e in (first, second)]
    assert [c["bytes"] for c in chat] == [[0xC3], [0xA9]]
    assert bytes(b for c in chat for b in c["bytes"]).decode() == "é"
    assert [t["bytes"] for t in chat[0]["top_logprobs"]] == [[0xC3], [ord("e")]]
