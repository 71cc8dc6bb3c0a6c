"""``ignore_eos`` (llama-server's extension) from the OpenAI chat and completions requests
to the sampler's parameters."""

import pytest
from pydantic import ValidationError

from exo.api import ollama, openai_chat, openai_completions
from exo.api.tests.scripted_node import small_card
from exo.shared.types.text_generation import TextGenerationTaskParams
from exo.worker.runner.sampling_params import sampling_params as _sampling  # pyright: ignore[reportPrivateUsage]

CARD = small_card("test-org/model-1")
CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 9}


def _sampled(params: TextGenerationTaskParams) -> bool:
    return _sampling(params, 9, None, None, None).ignore_eos


def test_chat_and_completions_pass_ignore_eos_to_the_sampler() -> None:
    chat = openai_chat.chat_task_params(
        openai_chat.ChatCompletionRequest.model_validate({**CHAT, "ignore_eos": True}), CARD
    )
    completion = openai_completions.completion_task_params(
        openai_completions.CompletionRequest.model_validate(
            {"model": "m1", "prompt": "x", "ignore_eos": True}
        ),
        CARD,
    )
    assert chat.ignore_eos and completion.ignore_eos
    assert _sampled(chat) and _sampled(completion)


def test_ignore_eos_is_off_unless_asked() -> None:
    chat = openai_chat.chat_task_params(
        openai_chat.ChatCompletionRequest.model_validate({**CHAT, "ignore_eos": None}), CARD
    )
    assert not chat.ignore_eos and not _sampled(chat)
    assert not ollama.OllamaOptions.model_validate({"ignore_eos": True}).sampling().ignore_eos


def test_a_non_boolean_ignore_eos_is_refused() -> None:
    with pytest.raises(ValidationError, match="ignore_eos"):
        openai_chat.ChatCompletionRequest.model_validate({**CHAT, "ignore_eos": "maybe"})
