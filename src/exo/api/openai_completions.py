"""OpenAI legacy Completions: ``POST /v1/completions``, whole or streamed. The prompt is
raw text or token ids: no chat template.

Each prompt of a list gets ``n`` choices, indexed prompt-major (choice ``p * n + j``), each
a generation of its own, run one after another. ``best_of`` generates that many per prompt
and keeps the ``n`` of highest cumulative log-probability. ``logprobs`` (0..5) answers
OpenAI's legacy logprobs object; with ``echo`` the prompt's own tokens come first, scored by
the model's prefill (the first token has none). ``max_tokens: 0`` with ``echo`` and
``logprobs`` scores the prompt alone (how evaluation harnesses use this endpoint)."""

import time
from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BeforeValidator, Field
from starlette.responses import Response

from exo.api.completions_choices import (
    Answer,
    Prompt,
    best,
    choice_json,
    logprobs_object,
    parse_prompts,
)
from exo.api.errors import ApiError
from exo.api.generation_events import (
    Failed,
    Finished,
    GenerationEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallEvent,
)
from exo.api.generation_service import GenerationService
from exo.api.openai_chat import (
    StreamOptions,
    failure_sse,
    finish_reason,
    stream_end,
    usage_json,
    usage_wanted,
)
from exo.api.streaming import GenerationStream, client_gone, complete, sse
from exo.api.task_params import SamplingOptions, build_task_params
from exo.shared.models.model_cards import ModelCard
from exo.shared.types.chunks import Usage
from exo.shared.types.common import CommandId
from exo.shared.types.text_generation import InputMessage, TextGenerationTaskParams

MAX_CHOICES = 8
"""``n`` and ``best_of``: choices are generated one after another."""
MAX_LOGPROBS = 5
"""OpenAI's own cap on the legacy ``logprobs``."""
MAX_GENERATIONS = 64
"""Generations of one request (prompts times ``best_of``)."""


class CompletionRequest(SamplingOptions):
    model: str
    prompt: Annotated[list[Prompt], BeforeValidator(parse_prompts)]
    # OpenAI's default for this endpoint; 0 generates nothing (with echo: the prompt alone).
    max_tokens: int = Field(default=16, ge=0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    echo: bool = False
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    best_of: int | None = Field(default=None, ge=1, le=MAX_CHOICES)
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    # llama-server's extension: end-of-sequence tokens are never sampled (a fixed length).
    ignore_eos: bool = False

    @property
    def generations(self) -> int:
        """Generations per prompt."""
        return self.best_of or self.n


def check_request(request: CompletionRequest) -> None:
    """The combinations OpenAI refuses, and ours: 400s naming the parameter."""
    if request.best_of is not None and request.best_of < request.n:
        message = f"best_of: must be at least n ({request.n}), got {request.best_of}"
        raise ApiError(400, message, param="best_of")
    total = len(request.prompt) * request.generations
    if total > MAX_GENERATIONS:
        message = (
            f"prompt: {len(request.prompt)} prompts x {request.generations} generations each "
            f"is {total}; at most {MAX_GENERATIONS} are run for one request"
        )
        raise ApiError(400, message, param="prompt")
    if not request.stream:
        return
    if request.generations > request.n:
        raise ApiError(400, "best_of: cannot be used with stream (send it whole)", param="best_of")
    if request.echo and (
        request.logprobs is not None or any(not isinstance(p, str) for p in request.prompt)
    ):
        message = (
            "echo: the echoed prompt's tokens (token-id prompts, logprobs) are answered "
            "whole: send this request without stream"
        )
        raise ApiError(400, message, param="echo")


def completion_task_params(
    request: CompletionRequest, card: ModelCard, prompt: Prompt | None = None
) -> TextGenerationTaskParams:
    """The task of one generation of ``prompt`` (default: the request's first)."""
    prompt = request.prompt[0] if prompt is None else prompt
    sampling = request.to_sampling(request.max_tokens, request.ignore_eos)
    text = prompt if isinstance(prompt, str) else ""
    params = build_task_params(
        card,
        [InputMessage(role="user", content=text)],
        sampling,
        stream=request.stream,
        names={"input": "prompt"},
        raw_prompt=text if isinstance(prompt, str) else None,
        # best_of ranks generations by their log-probabilities
        logprobs=request.logprobs is not None or request.generations > request.n,
        top_logprobs=request.logprobs or 0,
    )
    update: dict[str, Any] = {"echo": request.echo}
    if not isinstance(prompt, str):
        update["prompt_ids"] = list(prompt)
    return params.model_copy(update=update)


def generation_params(
    request: CompletionRequest, card: ModelCard
) -> list[tuple[Prompt, TextGenerationTaskParams]]:
    """Every generation of the request, prompt-major; with a seed, generation j of a prompt
    uses seed + j (they differ, and the whole answer is reproducible)."""
    out: list[tuple[Prompt, TextGenerationTaskParams]] = []
    for prompt in request.prompt:
        params = completion_task_params(request, card, prompt)
        for j in range(request.generations):
            seeded = (
                params
                if params.seed is None
                else params.model_copy(update={"seed": params.seed + j})
            )
            out.append((prompt, seeded))
    return out


def completion_id(command_id: CommandId) -> str:
    return f"cmpl-{command_id}"


def choice(text: str, finish: str | None, index: int = 0) -> dict[str, Any]:
    return {"text": text, "index": index, "logprobs": None, "finish_reason": finish}


def total_usage(answers: Sequence[Answer], prompts: int, per_prompt: int) -> Usage:
    """Each prompt counts once, every generation's tokens count (best_of's discarded ones
    too: they were computed)."""
    prompt_tokens = sum(a.finished.usage.prompt_tokens for a in answers[::per_prompt][:prompts])
    completion = sum(a.finished.usage.completion_tokens for a in answers)
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion)


class CompletionStreamEncoder:
    """``text_completion`` events of every choice (one after another), then ``[DONE]``."""

    def __init__(
        self,
        command_id: CommandId,
        model: str,
        created: int,
        include_usage: bool,
        prompts: Sequence[str],
        request: CompletionRequest,
    ) -> None:
        self._head = {
            "id": completion_id(command_id),
            "object": "text_completion",
            "created": created,
            "model": model,
        }
        self._include_usage = include_usage
        # Each choice's echoed prompt ("" without echo), and its text offset so far.
        self._prompts = list(prompts)
        self._echo = request.echo
        self._logprobs = request.logprobs is not None
        self._offsets = [0 if request.echo else len(p) for p in prompts]
        self._opened: set[int] = set()
        self._finished: list[Finished] = []
        self._n = request.n

    def _chunk(self, payload: dict[str, Any]) -> bytes:
        return sse({**self._head, "choices": [payload]})

    def begin(self, prompt_tokens: int) -> list[bytes]:
        return []

    def _open(self, index: int) -> list[bytes]:
        """A choice's echoed prompt, before its first text."""
        if index in self._opened:
            return []
        self._opened.add(index)
        prompt = self._prompts[index]
        if not self._echo or not prompt:
            return []
        self._offsets[index] += len(prompt)
        return [self._chunk(choice(prompt, None, index))]

    def encode(self, event: GenerationEvent, index: int = 0) -> list[bytes]:
        match event:
            case TextDelta() | ReasoningDelta():
                payload = choice(event.text, None, index)
                if self._logprobs and isinstance(event, TextDelta):
                    payload["logprobs"] = logprobs_object(event.logprobs, self._offsets[index])
                self._offsets[index] += len(event.text)
                return [*self._open(index), self._chunk(payload)]
            case ToolCallEvent():
                return []
            case Finished():
                self._finished.append(event)
                end = self._chunk(choice("", finish_reason(event.reason), index))
                out = [*self._open(index), end]
                if len(self._finished) < len(self._prompts):
                    return out
                return [*out, *stream_end(self._head, self._usage())]
            case Failed():
                return failure_sse(event)

    def _usage(self) -> Usage | None:
        if not self._include_usage:
            return None
        firsts = self._finished[:: self._n]
        return Usage(
            prompt_tokens=sum(f.usage.prompt_tokens for f in firsts),
            completion_tokens=sum(f.usage.completion_tokens for f in self._finished),
        )


def whole_completion(
    request: CompletionRequest, command_id: CommandId, model: str, created: int,
    answers: Sequence[Answer],
) -> dict[str, Any]:  # fmt: skip
    per_prompt = request.generations
    choices: list[dict[str, Any]] = []
    for p in range(len(request.prompt)):
        kept = best(answers[p * per_prompt : (p + 1) * per_prompt], request.n)
        for j, answer in enumerate(kept):
            choices.append(
                choice_json(
                    answer,
                    p * request.n + j,
                    echo=request.echo,
                    logprobs=request.logprobs is not None,
                    finish=finish_reason(answer.finished.reason),
                )
            )
    usage = total_usage(answers, len(request.prompt), per_prompt)
    return {
        "id": completion_id(command_id),
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage_json(usage),
    }


def router(service: GenerationService) -> APIRouter:
    api = APIRouter()

    @api.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        check_request(body)
        card = await service.resolve_model_async(body.model)
        runs = generation_params(body, card)
        created = int(time.time())
        if body.stream:
            include_usage = usage_wanted(body.stream_options)
            prompts = [p if isinstance(p, str) else "" for p, _ in runs]

            def encoder(command_id: CommandId) -> CompletionStreamEncoder:
                return CompletionStreamEncoder(
                    command_id, card.model_id, created, include_usage, prompts, body
                )

            params = [p for _, p in runs]
            return GenerationStream(service, params, card, encoder, "text/event-stream")
        answers: list[Answer] = []
        first_id: CommandId | None = None
        for prompt, params in runs:
            result = await complete(service, request, params, card)
            if result is None:
                return client_gone()
            command_id, text, finished = result
            first_id = first_id or command_id
            answers.append(Answer(prompt, text, finished))
        assert first_id is not None
        return JSONResponse(whole_completion(body, first_id, card.model_id, created, answers))

    return api
