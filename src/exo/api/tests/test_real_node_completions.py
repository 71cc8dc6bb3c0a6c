"""Legacy completions' logprobs, echo, n, best_of and token prompts, and logit_bias, against
one real node serving the embedded model, through the official client: the prompt's scores
come from the runner's prefill and match transformers' log_softmax on the same file."""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import torch

from exo.tests.node_process import NodeProcess, running_node
from exo.worker.download.embedded import find_embedded_gguf
from exo.worker.engines.tokenizer import EngineTokenizer, load_tokenizer

pytestmark = [pytest.mark.slow]

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
PROMPT = "The capital of France is Paris, and the capital of Italy is"
# The fast (quantised) engine's logits are within 0.05 of transformers' (see
# test_engine_reference): a log-probability is within twice that.
TOLERANCE = 0.1


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    tmp: Path = tmp_path_factory.mktemp("api-completions")
    with running_node(tmp, timeout=300) as n:
        yield n


def oa(node: NodeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=120)


def _reference(prompt_ids: list[int]) -> list[float]:
    """transformers' log-probability of each prompt token after the first."""
    from exo.worker.engines.tests.hf_reference import transformers_llama

    path = find_embedded_gguf()
    assert path is not None
    with torch.inference_mode():
        logits = transformers_llama(path)(torch.tensor([prompt_ids])).logits[0]
    lp = torch.log_softmax(logits.float(), dim=-1)
    return lp[torch.arange(len(prompt_ids) - 1), torch.tensor(prompt_ids[1:])].tolist()


def _token_bytes(token: str) -> bytes:
    """A legacy logprobs token's bytes: its text, or the bytes a "bytes:\\xf0\\x9f" one names."""
    if token.startswith("bytes:"):
        return bytes(int(h, 16) for h in token[len("bytes:") :].split("\\x")[1:])
    return token.encode()


def test_issue_example_two_choices_with_echoed_logprobs(node: NodeProcess) -> None:
    # seeded, so that it runs the same every time (a token may hold part of a character:
    # its entry shows bytes, see test_a_token_holding_part_of_a_character_shows_its_bytes)
    reply = oa(node).completions.create(
        model=MODEL, prompt="Hello", max_tokens=3, logprobs=2, n=2, echo=True, seed=7
    )
    assert [c.index for c in reply.choices] == [0, 1]
    for c in reply.choices:
        lp = c.logprobs
        assert lp is not None and lp.tokens and lp.token_logprobs and lp.text_offset
        assert lp.top_logprobs is not None
        assert c.text.startswith("Hello")
        prompt_len = len(lp.tokens) - 3
        assert prompt_len >= 1 and "".join(lp.tokens[:prompt_len]) == "Hello"
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert all(v is not None and v <= 0 for v in lp.token_logprobs[1:])
        assert all(t is not None and len(t) <= 2 for t in lp.top_logprobs[1:])
        assert b"".join(map(_token_bytes, lp.tokens)).decode() == c.text
        assert lp.text_offset == [
            len(b"".join(map(_token_bytes, lp.tokens[:i])).decode(errors="ignore"))
            for i in range(len(lp.tokens))
        ]


def test_a_token_holding_part_of_a_character_shows_its_bytes(
    node: NodeProcess, tmp_path: Path
) -> None:
    """🎉 is three byte-level tokens; the first (f0 9f) decodes alone to U+FFFD. Its entry
    carries its bytes: chat's ``bytes``, and legacy completions' "bytes:\\xf0\\x9f"."""
    tokenizer = _tokenizer(tmp_path)
    first = tokenizer.encode("🎉")[0]
    assert tokenizer.token_text(first) == ("\ufffd", [0xF0, 0x9F])
    bias = {str(first): 100}
    legacy = oa(node).completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0, logprobs=1, logit_bias=bias
    )
    lp = legacy.choices[0].logprobs
    assert lp is not None and lp.tokens == ["bytes:\\xf0\\x9f"]
    assert lp.text_offset == [len(PROMPT)]
    messages: Any = [{"role": "user", "content": "Celebrate!"}]
    chat = oa(node).chat.completions.create(
        model=MODEL, messages=messages, max_tokens=1, temperature=0, logprobs=True,
        top_logprobs=2, logit_bias=bias,
    )  # fmt: skip
    logprobs = chat.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    [entry] = logprobs.content
    assert entry.token == "\ufffd" and entry.bytes == [0xF0, 0x9F]
    # (the alternatives are the model's own, before the bias: whole tokens here)
    assert entry.top_logprobs and all(
        t.bytes == list(t.token.encode()) for t in entry.top_logprobs
    )


def test_prompt_scores_match_transformers(node: NodeProcess, tmp_path: Path) -> None:
    """max_tokens 0 with echo and logprobs scores the prompt alone (lm-evaluation-harness)."""
    reply = oa(node).completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=0, logprobs=1, echo=True, temperature=0
    )
    (c,) = reply.choices
    assert c.text == PROMPT and c.finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 0
    lp = c.logprobs
    assert lp is not None and lp.token_logprobs is not None and lp.tokens is not None
    # the same prompt as token ids scores the same
    ids = _tokenizer(tmp_path).encode(PROMPT, add_special_tokens=True)
    assert len(lp.tokens) == len(ids) == reply.usage.prompt_tokens
    by_ids = oa(node).completions.create(
        model=MODEL, prompt=ids, max_tokens=0, logprobs=1, echo=True
    )
    assert by_ids.choices[0].logprobs is not None
    assert by_ids.choices[0].logprobs.token_logprobs == lp.token_logprobs
    assert by_ids.choices[0].text == PROMPT
    expected = _reference(ids)
    ours: list[Any] = list(lp.token_logprobs[1:])
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(expected), atol=TOLERANCE, rtol=0.0)


def test_best_of_and_list_prompts(node: NodeProcess) -> None:
    reply = oa(node).completions.create(
        model=MODEL, prompt=["One, two,", "Red, green,"], max_tokens=4, n=2, best_of=3, seed=1
    )
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    assert all(c.logprobs is None for c in reply.choices)  # ranked by them, not asked for
    assert reply.usage is not None and 0 < reply.usage.completion_tokens <= 2 * 3 * 4
    ids = oa(node).completions.create(
        model=MODEL, prompt=[[504, 2365], [6354]], max_tokens=2, temperature=0, echo=True
    )
    assert [c.index for c in ids.choices] == [0, 1]
    assert all(c.text for c in ids.choices)


def test_logit_bias_steers_greedy_and_keeps_structured_output(
    node: NodeProcess, tmp_path: Path
) -> None:
    tokenizer = _tokenizer(tmp_path)
    (banana,) = tokenizer.encode(" banana")
    pushed = oa(node).completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, logit_bias={str(banana): 100}
    )
    assert pushed.choices[0].text == " banana" * 3
    messages: Any = [{"role": "user", "content": "Name one colour."}]
    free = oa(node).chat.completions.create(
        model=MODEL, messages=messages, max_tokens=3, temperature=0
    )
    chat = oa(node).chat.completions.create(
        model=MODEL, messages=messages, max_tokens=3, temperature=0, logit_bias={str(banana): 100}
    )
    assert chat.choices[0].message.content == " banana" * 3 != free.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as info:
        oa(node).chat.completions.create(
            model=MODEL, messages=messages, max_tokens=2, logit_bias={"49152": 5}
        )
    assert "logit_bias" in str(info.value) and "49152" in str(info.value)
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string"}},
        "required": ["colour"],
        "additionalProperties": False,
    }
    response_format: Any = {
        "type": "json_schema",
        "json_schema": {"name": "c", "schema": schema, "strict": True},
    }
    (quote,) = tokenizer.encode('"')
    shaped = oa(node).chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=40,
        temperature=0,
        # the quote pushed as hard as it goes: the grammar still decides where it may be
        logit_bias={str(quote): 100},
        response_format=response_format,
    )
    content = shaped.choices[0].message.content
    assert content is not None and json.loads(content) == {"colour": ""}


def _tokenizer(tmp_path: Path) -> EngineTokenizer:
    path = find_embedded_gguf()
    assert path is not None
    return load_tokenizer(path, tmp_path / "tokenizer")


def test_streamed_logprobs_match_the_whole_answer(node: NodeProcess) -> None:
    args: dict[str, Any] = {"model": MODEL, "prompt": PROMPT, "max_tokens": 5, "temperature": 0}
    whole = oa(node).completions.create(**args, logprobs=1)
    lp = whole.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.text_offset is not None
    assert "".join(lp.tokens) == whole.choices[0].text
    assert lp.text_offset[0] == len(PROMPT)  # offsets count from the end of the prompt
    tokens: list[str] = []
    offsets: list[int] = []
    text = ""
    for chunk in oa(node).completions.create(**args, logprobs=1, stream=True):
        for c in chunk.choices:
            text += c.text
            if c.logprobs is not None and c.logprobs.tokens:
                tokens.extend(c.logprobs.tokens)
                offsets.extend(c.logprobs.text_offset or [])
    assert text == whole.choices[0].text and tokens == lp.tokens and offsets == lp.text_offset
    # echo alone with max_tokens 0: the prompt back, nothing generated, nothing scored
    echoed = oa(node).completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True)
    assert echoed.choices[0].text == PROMPT and echoed.choices[0].logprobs is None
    assert echoed.usage is not None and echoed.usage.completion_tokens == 0


def test_ignore_eos_runs_chat_and_completions_to_max_tokens(node: NodeProcess) -> None:
    """llama-server's extension: without it the short answer ends at the end-of-sequence
    token; with it, both endpoints answer exactly max_tokens tokens."""
    client = oa(node)
    messages: Any = [{"role": "user", "content": "Reply with just the word yes."}]
    short = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=48, temperature=0
    )
    assert short.choices[0].finish_reason == "stop"
    assert short.usage is not None and short.usage.completion_tokens < 48
    long = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=48, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert long.choices[0].finish_reason == "length"
    assert long.usage is not None and long.usage.completion_tokens == 48
    text = client.completions.create(
        model=MODEL, prompt="The end.", max_tokens=40, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert text.choices[0].finish_reason == "length"
    assert text.usage is not None and text.usage.completion_tokens == 40
