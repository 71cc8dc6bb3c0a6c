"""Legacy completions through the official client; images refused naming vision."""

import base64
from typing import Any

import httpx
import ollama
import openai
import pytest

from exo.api.tests.scripted_node import PROMPT_TOKENS, TEXT, ScriptedNode, ServedApp
from exo.api.tests.test_images import data_url, image_bytes
from exo.shared.models.model_cards import HubSource

PNG = image_bytes("PNG")
PNG_B64 = base64.b64encode(PNG).decode()


def oa(server: ServedApp) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=10)


def test_completion_whole_and_streamed(server: ServedApp, node: ScriptedNode) -> None:
    whole = oa(server).completions.create(model="m1", prompt="Once upon", max_tokens=50, seed=3)
    assert whole.object == "text_completion" and whole.choices[0].text == TEXT
    assert whole.choices[0].finish_reason == "stop"
    assert whole.usage is not None and whole.usage.prompt_tokens == PROMPT_TOKENS
    params = node.generations[-1].task_params
    assert params.raw_prompt == "Once upon" and params.seed == 3 and params.max_tokens == 50
    chunks = list(
        oa(server).completions.create(
            model="m1", prompt=["Once upon"], stream=True, stream_options={"include_usage": True}
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == TEXT
    assert chunks[-1].usage is not None
    # The endpoint's default limit is 16 tokens.
    assert node.generations[-1].task_params.max_tokens == 16
    echoed = oa(server).completions.create(model="m1", prompt="Say: ", echo=True)
    assert echoed.choices[0].text == "Say: " + TEXT


def test_completion_refuses_a_malformed_prompt_list(shared_server: ServedApp) -> None:
    for prompt in (["a", 5], [], [[1, 2], []], [True, 2]):
        r = httpx.post(f"{shared_server.url}/v1/completions", json={"model": "m1", "prompt": prompt})
        assert r.status_code == 400, (prompt, r.text)
        assert r.json()["error"]["param"] == "prompt"


def test_images_are_a_400_naming_vision(shared_server: ServedApp) -> None:
    image: Any = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": data_url(PNG)}},
            ],
        }
    ]
    with pytest.raises(openai.BadRequestError) as info:
        oa(shared_server).chat.completions.create(model="m1", messages=image)
    assert "vision" in str(info.value)
    with pytest.raises(ollama.ResponseError) as ol:
        ollama.Client(host=shared_server.url).chat(
            model="m1", messages=[{"role": "user", "content": "x", "images": [PNG_B64]}]
        )
    assert ol.value.status_code == 400 and "vision" in ol.value.error
    r = httpx.post(
        f"{shared_server.url}/v1/messages",
        json={
            "model": "m1",
            "max_tokens": 5,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image", "source": {"type": "base64", "data": PNG_B64}}],
                }
            ],
        },
    )
    assert r.status_code == 400 and "vision" in r.json()["error"]["message"]


def test_ollama_quantization_and_unload(server: ServedApp, node: ScriptedNode) -> None:
    client = ollama.Client(host=server.url, timeout=10)
    shown = client.show("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert shown.details is not None and shown.details.quantization_level == "Q4_1"
    # The model's own chat template, as its card carries it.
    assert shown.template is not None and "<|im_start|>assistant" in shown.template
    client.generate(model="m1", prompt="hi")  # places and serves m1
    assert any(
        i.shard_assignments.model_id == "test-org/model-1" for i in node.state().instances.values()
    )
    r = httpx.post(f"{server.url}/api/generate", json={"model": "m1", "keep_alive": 0}, timeout=10)
    assert r.status_code == 200 and r.json()["done_reason"] == "unload"
    assert not any(
        i.shard_assignments.model_id == "test-org/model-1" for i in node.state().instances.values()
    )


def test_quantization_level_from_file_names() -> None:
    from exo.api.ollama_models import quantization_level
    from exo.api.tests.scripted_node import small_card

    card = small_card("x")
    for source, level in (
        ("/m/Qwen3-8B-Q4_K_M.gguf", "Q4_K_M"),
        ("/m/model.IQ2_XS.gguf", "IQ2_XS"),
        ("/m/model-f16.gguf", "F16"),
        ("/m/model.gguf", "unknown"),
        ("/m/folder", "BF16"),
    ):
        assert quantization_level(card.model_copy(update={"source": source})) == level
    # A hub GGUF card (no local file yet) names the quant it pinned.
    hub = HubSource(repo_id="o/r", revision="0" * 40, files=[], gguf_quant="q6_k")
    assert quantization_level(card.model_copy(update={"hub": hub})) == "Q6_K"
