"""Images through each API's own shapes, with the official clients, to a scripted node: the
task carries the decoded images; a bad image or a model without vision is a 400 naming it."""

import base64
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from exo.api.images import decode_image
from exo.api.main import create_app
from exo.api.settings import ApiSettings
from exo.api.tests.scripted_node import TEXT, ScriptedNode, ServedApp, default_cards, small_card
from exo.api.tests.test_images import bomb_png, data_url, image_bytes
from exo.shared.types.text_generation import InputMessage

PNG = image_bytes("PNG", (6, 4), color=7)
JPEG = image_bytes("JPEG", (9, 5), color=90)
B64 = base64.b64encode(PNG).decode()


class VisionServer(ServedApp):
    def __init__(self, node: ScriptedNode) -> None:
        super().__init__(create_app(node, ApiSettings(port=0, placement_timeout_s=5.0)), node)
        self.node = node


@pytest.fixture(scope="module")
def vision_server() -> Iterator[VisionServer]:
    vision = small_card("test-org/vision-1", ["v1"]).model_copy(update={"vision": True})
    served = VisionServer(ScriptedNode(cards=[*default_cards(), vision]))
    served.start()
    yield served
    served.stop()


def oa(server: ServedApp) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=10)


def last_user(server: VisionServer) -> InputMessage:
    params = server.node.generations[-1].task_params
    return [m for m in params.input if m.role == "user"][-1]


def sizes(message: InputMessage) -> list[tuple[int, int]]:
    return [(i.width, i.height) for i in message.images]


def chat_parts(*urls: str) -> list[Any]:
    parts: list[Any] = [{"type": "text", "text": "what is this?"}]
    parts += [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return [{"role": "user", "content": parts}]


def test_openai_chat_images_whole_and_streamed(vision_server: VisionServer) -> None:
    client = oa(vision_server)
    messages = chat_parts(data_url(PNG), data_url(JPEG, "image/jpeg"))
    whole = client.chat.completions.create(model="v1", messages=messages)
    assert whole.choices[0].message.content == TEXT
    message = last_user(vision_server)
    assert message.content == "what is this?" and sizes(message) == [(6, 4), (9, 5)]
    assert message.images[0].sha256 == decode_image(PNG).sha256
    chunks = list(client.chat.completions.create(model="v1", messages=messages, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == TEXT
    assert sizes(last_user(vision_server)) == [(6, 4), (9, 5)]


def test_responses_input_image(vision_server: VisionServer) -> None:
    content: Any = [
        {"type": "input_text", "text": "describe"},
        {"type": "input_image", "image_url": data_url(PNG), "detail": "auto"},
    ]
    items: Any = [{"role": "user", "content": content}]
    answer = oa(vision_server).responses.create(model="v1", input=items)
    assert answer.output_text == TEXT
    assert sizes(last_user(vision_server)) == [(6, 4)]
    events = list(oa(vision_server).responses.create(model="v1", input=items, stream=True))
    assert events[-1].type == "response.completed"
    assert last_user(vision_server).content == "describe"


def test_claude_image_blocks(vision_server: VisionServer) -> None:
    client = anthropic.Anthropic(base_url=vision_server.url, api_key="x", max_retries=0)
    source: Any = {"type": "base64", "media_type": "image/png", "data": B64}
    content: Any = [{"type": "image", "source": source}, {"type": "text", "text": "what?"}]
    answer = client.messages.create(
        model="v1", max_tokens=20, messages=[{"role": "user", "content": content}]
    )
    assert answer.content[0].type == "text" and answer.content[0].text == TEXT
    assert sizes(last_user(vision_server)) == [(6, 4)]
    with client.messages.stream(
        model="v1", max_tokens=20, messages=[{"role": "user", "content": content}]
    ) as stream:
        assert stream.get_final_text() == TEXT
    url: Any = {"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}}
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(
            model="v1", max_tokens=20, messages=[{"role": "user", "content": [url]}]
        )
    assert "not fetched" in str(info.value) and "source" in str(info.value)


def test_ollama_images(vision_server: VisionServer) -> None:
    client = ollama.Client(host=vision_server.url, timeout=10)
    answer = client.chat(model="v1", messages=[{"role": "user", "content": "hi", "images": [B64]}])
    assert answer.message.content == TEXT
    assert sizes(last_user(vision_server)) == [(6, 4)]
    parts = list(client.generate(model="v1", prompt="what?", images=[PNG, JPEG], stream=True))
    assert "".join(p.response or "" for p in parts) == TEXT
    assert sizes(last_user(vision_server)) == [(6, 4), (9, 5)]
    with pytest.raises(ollama.ResponseError) as info:
        client.generate(model="v1", prompt="x", images=[PNG], raw=True)
    assert info.value.status_code == 400 and "raw" in info.value.error


BAD: list[tuple[bytes, str]] = [
    (b"garbage bytes", "cannot be read"),
    (bomb_png(8000, 8000), "8000x8000"),
    (image_bytes("BMP"), "unsupported image format BMP"),
]


@pytest.mark.parametrize(("data", "words"), BAD)
def test_bad_images_are_400s_in_every_api(
    vision_server: VisionServer, data: bytes, words: str
) -> None:
    url = vision_server.url
    text = base64.b64encode(data).decode()
    with pytest.raises(openai.BadRequestError) as chat:
        oa(vision_server).chat.completions.create(
            model="v1", messages=chat_parts(data_url(PNG), data_url(data))
        )
    assert words in str(chat.value) and "part 2" in str(chat.value)
    assert chat.value.body is not None and "messages.0.content" in str(chat.value.body)
    items: Any = [
        {"role": "user", "content": [{"type": "input_image", "image_url": data_url(data)}]}
    ]
    with pytest.raises(openai.BadRequestError) as resp:
        oa(vision_server).responses.create(model="v1", input=items)
    assert words in str(resp.value)
    source = {"type": "base64", "media_type": "image/png", "data": text}
    r = httpx.post(
        f"{url}/v1/messages",
        json={
            "model": "v1",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": [{"type": "image", "source": source}]}],
        },
    )
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert words in r.json()["error"]["message"]
    with pytest.raises(ollama.ResponseError) as ol:
        ollama.Client(host=url).chat(
            model="v1", messages=[{"role": "user", "content": "x", "images": [B64, text]}]
        )
    assert ol.value.status_code == 400 and words in ol.value.error and "image 1" in ol.value.error


def test_images_to_a_text_model_are_a_400_naming_it(vision_server: VisionServer) -> None:
    with pytest.raises(openai.BadRequestError) as chat:
        oa(vision_server).chat.completions.create(model="m1", messages=chat_parts(data_url(PNG)))
    assert "test-org/model-1 does not take images" in str(chat.value)
    with pytest.raises(ollama.ResponseError) as ol:
        ollama.Client(host=vision_server.url).generate(model="m1", prompt="x", images=[PNG])
    assert ol.value.status_code == 400 and "does not take images" in ol.value.error
    r = httpx.post(
        f"{vision_server.url}/v1/messages",
        json={
            "model": "m1",
            "max_tokens": 5,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": B64},
                        }
                    ],
                }
            ],
        },
    )
    assert r.status_code == 400 and "does not take images" in r.json()["error"]["message"]


def test_listings_say_which_models_take_images(vision_server: VisionServer) -> None:
    models = {m.id: m for m in oa(vision_server).models.list()}
    assert (models["test-org/vision-1"].model_extra or {})["input_modalities"] == ["text", "image"]
    assert (models["test-org/model-1"].model_extra or {})["input_modalities"] == ["text"]
    client = ollama.Client(host=vision_server.url, timeout=10)
    shown = client.show("v1").capabilities or []
    assert "vision" in shown and "completion" in shown
    assert "vision" not in (client.show("m1").capabilities or [])


def test_image_errors_read_as_the_validators_text(vision_server: VisionServer) -> None:
    """The message is the parameter, then what is wrong with which part; pydantic's wording
    ("Value error, ") is not the client's concern."""
    with pytest.raises(openai.BadRequestError) as chat:
        oa(vision_server).chat.completions.create(
            model="v1", messages=chat_parts(data_url(b"garbage bytes"))
        )
    message = chat.value.response.json()["error"]["message"]
    assert message.startswith("messages.0.content: part 1 (image_url): the image cannot be read")
    with pytest.raises(ollama.ResponseError) as ol:
        ollama.Client(host=vision_server.url).chat(
            model="v1", messages=[{"role": "user", "content": "x", "images": [B64, "@@"]}]
        )
    assert ol.value.error == "messages.0.images: image 1: the image is not valid base64"
