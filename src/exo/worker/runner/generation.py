"""Serving requests on a loaded engine: continuous batching, text, stops and chunks.

The runner calls ``submit`` for each request, ``step`` between its input checks, and
``cancel``; each returns the events to send (chunks and task statuses)."""

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import torch
from loguru import logger

from exo.shared.chat_formats import keeps_special_tokens
from exo.shared.types.chunks import (
    EchoedPrompt,
    ErrorCode,
    FinishReason,
    TokenChunk,
    TokenLogprob,
    TopLogprob,
    Usage,
    error_chunk,
)
from exo.shared.types.events import ChunkGenerated, Event, TaskStatusUpdated
from exo.shared.types.tasks import TaskId, TaskStatus, TextGeneration
from exo.shared.types.text_generation import TextGenerationTaskParams
from exo.shared.types.worker.downloads import DownloadCompleted, DownloadFailed
from exo.shared.types.worker.instances import BoundInstance
from exo.shared.types.worker.shards import PipelineShardMetadata, layer_range
from exo.worker.download.local import locate_progress
from exo.worker.engines.batch import SERVE_PREFILL_TURN, BatchGenerator
from exo.worker.engines.chat_prompt import ToolFormat, chat_prompt, json_object
from exo.worker.engines.engine import DEFAULT_MAX_SEQ, Engine, load_engine
from exo.worker.engines.grammar import (
    GrammarCompiler,
    GrammarConstraint,
    GrammarError,
    schema_grammar,
    tool_call_grammar,
)
from exo.worker.engines.kv_cache import pages_for
from exo.worker.engines.llama import LlamaModel
from exo.worker.engines.sampling import TokenLogprobs
from exo.worker.engines.text import IncrementalDetokenizer, StopMatcher
from exo.worker.runner.distributed import Follower, Kind, LeaderModel, load_local_model
from exo.worker.runner.image_jobs import ImageJobs
from exo.worker.runner.microbatch import PipelinedBatcher, pipeline_slots, pipelined_batcher
from exo.worker.runner.prompt_images import (
    ImageError,
    expand_markers,
    image_refusal,
    request_images,
)
from exo.worker.runner.sampling_params import sampling_params
from exo.worker.runner.settings import RunnerSettings

Progress = Callable[[int, int], None]


@dataclass
class _Request:
    task: TextGeneration
    detokenizer: IncrementalDetokenizer
    stops: StopMatcher
    prompt_tokens: int
    # Text the prompt ends with that is part of the answer (a forced call's opening).
    prefix: str = ""
    # Filled by the sampler when the request wants log-probabilities.
    logprob_sink: list[TokenLogprobs] | None = None
    pending_logprobs: list[TokenLogprob] = field(default_factory=list[TokenLogprob])
    completion_tokens: int = 0
    # With return_context: the prompt's and the output's token ids so far.
    context: list[int] | None = None
    # With echo: the prompt's ids, and its tokens' log-probabilities when asked (the prefill
    # fills them in).
    echo_ids: list[int] | None = None
    prompt_sink: list[TokenLogprobs] | None = None
    chunks_sent: int = 0
    started: float = field(default_factory=time.perf_counter)


class Generation:
    def __init__(self, engine: Engine, max_batch: int, leader: LeaderModel | None = None) -> None:
        self.engine = engine
        self.leader = leader
        self.max_seq = min(engine.config.context_length, DEFAULT_MAX_SEQ)
        self.batch: BatchGenerator | PipelinedBatcher = (
            pipelined_batcher(leader, leader.world_size,
                              pipeline_slots(max_batch, leader.world_size), self.max_seq,
                              sorted({*engine.config.eos_token_ids, *engine.tokenizer.eos_token_ids}),
                              pages=max_batch * pages_for(self.max_seq))
            if leader is not None and leader.kind == "pipeline"
            else engine.batch_generator(max_batch, self.max_seq, prefill_turn=SERVE_PREFILL_TURN)
        )
        self.requests: dict[TaskId, _Request] = {}
        self.max_batch = max_batch
        self._grammars: GrammarCompiler | None = None
        self.images = ImageJobs()  # requests whose images encode off this thread

    @property
    def active(self) -> int:
        return len(self.requests)

    @property
    def stepping(self) -> bool:  # `step` has work: a request not only waiting for its images
        return self.active > self.images.waiting or self.images.ready

    def warmup(self) -> None:
        self.engine.warmup()

    def submit(self, task: TextGeneration) -> list[Event]:
        params = task.task_params
        if params.embed:
            return self._embedded(task)
        tensor = self.leader is not None and self.leader.kind == "tensor"
        refusal = image_refusal(self.engine.vision, tensor, params)
        if refusal is not None:  # rather than answer without them
            return self._failed(task, refusal, "invalid_request")
        images = request_images(params)
        tokenizer = self.engine.tokenizer
        try:
            prefix = ""
            constraint = None
            if params.prompt_ids is not None:
                prompt = ""
            elif params.raw_prompt is not None:
                prompt = params.raw_prompt
            else:
                chat = chat_prompt(
                    params.input,
                    params.tools,
                    params.tool_choice,
                    params.forced_tool,
                    tokenizer.meta.chat_template,
                )
                constraint = self._constraint(params, chat.format)
                # A grammar writes the whole call; without one, the prompt opens it.
                prefix = "" if constraint is not None else chat.prefix
                prompt = (
                    tokenizer.render_chat(
                        chat.messages,
                        tools=chat.tools,
                        template_kwargs=params.template_kwargs,
                        continue_final=params.continue_final_message,
                    )
                    + prefix
                )
            prompt = expand_markers(self.engine.vision, prompt, images)
            # A template that opens the thought: the answer's text starts inside it.
            opened = not prefix and prompt.rstrip().endswith("<think>")
            shown = "<think>" if opened else prefix
            # A raw prompt gets the BOS the model asks for; a chat template writes its own.
            prompt_ids = (
                list(params.prompt_ids)
                if params.prompt_ids is not None
                else tokenizer.encode(prompt, add_special_tokens=params.raw_prompt is not None)
            )
        except (GrammarError, ImageError) as e:
            return self._failed(task, str(e), "invalid_request")
        except Exception as e:  # this request is refused; the others go on
            logger.warning(f"request {task.task_id} refused: {e}")
            return self._failed(task, f"{type(e).__name__}: {e}")
        context = params.context_tokens
        error = (
            self._token_error("context", context)
            or self._token_error("prompt", params.prompt_ids or [])
            or self._token_error("logit_bias", params.logit_bias)
        )
        if error is not None:
            return self._failed(task, error, "invalid_request")
        if context:
            prompt_ids = [*context, *prompt_ids]
        limit = min(self.max_seq, params.num_ctx or self.max_seq)
        if params.count_only:
            return self._counted(task, len(prompt_ids))
        if len(prompt_ids) >= limit:
            message = (
                f"this model's maximum context length is {limit} tokens, "
                f"but the prompt is {len(prompt_ids)} tokens"
                + (f" ({len(context)} of them from 'context')" if context else "")
            )
            return self._failed(task, message, "context_length_exceeded")
        sink: list[TokenLogprobs] | None = [] if params.logprobs else None
        prompt_sink: list[TokenLogprobs] | None = [] if params.logprobs and params.echo else None
        wanted = params.max_tokens if params.max_tokens is not None else limit
        max_tokens = min(wanted, limit - len(prompt_ids))
        # max_tokens 0 runs the model only to score the prompt
        runs = max_tokens > 0 or prompt_sink is not None
        try:
            if runs:
                sampling = sampling_params(params, max_tokens, constraint, sink, prompt_sink)
                self.images.add(self.batch, task.task_id, self.engine.vision, images,
                                prompt_ids, sampling)  # fmt: skip
        except Exception as e:  # this request is refused; the others go on
            logger.warning(f"request {task.task_id} refused: {e}")
            return self._failed(task, f"{type(e).__name__}: {e}")
        decode = tokenizer.decode
        markers = keeps_special_tokens(tokenizer.meta.chat_template)
        if markers or (params.tools and params.tool_choice != "none"):
            # Call markers may be special tokens (<|python_tag|>, [TOOL_CALLS]); harmony,
            # DeepSeek, Kimi and GLM write all their structure in them.
            def decode(ids: Sequence[int]) -> str:
                return tokenizer.decode(ids, skip_special_tokens=False)

        self.requests[task.task_id] = _Request(
            task=task,
            detokenizer=IncrementalDetokenizer(decode, prompt_ids),
            stops=StopMatcher(params.stop),
            prompt_tokens=len(prompt_ids),
            prefix=shown,
            logprob_sink=sink,
            context=list(prompt_ids) if params.return_context else None,
            echo_ids=list(prompt_ids) if params.echo else None,
            prompt_sink=prompt_sink,
        )
        return [] if runs else self._chunk(self.requests[task.task_id], "", -1, "length")

    def _token_error(self, name: str, ids: Iterable[int]) -> str | None:
        """Why the token ids a request's parameter ``name`` holds are not this model's, if
        they are not."""
        vocab = self.engine.config.vocab
        for i, token in enumerate(ids):
            if not 0 <= token < vocab:
                where = "" if isinstance(ids, dict) else f" (item {i})"
                return (
                    f"{name}: token id {token}{where} is not below the model's "
                    f"vocabulary size of {vocab}"
                )
        return None

    def _constraint(
        self, params: TextGenerationTaskParams, fmt: ToolFormat
    ) -> GrammarConstraint | None:
        """The grammar a request's output must follow: its JSON schema, or a call."""
        if params.json_schema is not None:
            grammar = schema_grammar(json_object(params.json_schema))
        elif params.tools and params.tool_choice == "required":
            token_id = self.engine.tokenizer.backend.token_to_id
            grammar = tool_call_grammar(fmt, params.tools, params.forced_tool, token_id)
        else:
            return None
        if self._grammars is None:
            self._grammars = GrammarCompiler(self.engine.tokenizer, self.engine.config.vocab)
        return self._grammars.constraint(grammar)

    def _embedded(self, task: TextGeneration) -> list[Event]:
        """The answer to an embedding request: one final chunk with the vector (computed
        here, in one forward pass over the input)."""
        params = task.task_params
        if self.leader is not None:
            message = "embeddings need the model on one runner; this instance spans several"
            return self._failed(task, message, "invalid_request")
        text = params.raw_prompt if params.raw_prompt is not None else params.input[-1].content
        try:
            ids = self.engine.tokenizer.encode(text, add_special_tokens=True)
        except Exception as e:  # this request is refused; the others go on
            return self._failed(task, f"{type(e).__name__}: {e}")
        if params.context_tokens:  # token ids to embed as they are
            error = self._token_error("input", params.context_tokens)
            if error is not None:
                return self._failed(task, error, "invalid_request")
            ids = list(params.context_tokens)
        limit = min(self.max_seq, params.num_ctx or self.max_seq)
        if not ids:
            return self._failed(task, "the input has no tokens to embed", "invalid_request")
        if len(ids) > limit and params.truncate:
            ids = ids[:limit]
        if len(ids) > limit:
            message = (
                f"this model's maximum context length is {limit} tokens, "
                f"but the input is {len(ids)} tokens"
            )
            return self._failed(task, message, "context_length_exceeded")
        try:
            vector = self.engine.embedding(ids)
        except Exception as e:  # e.g. a pipeline shard: refused, the others go on
            logger.warning(f"embedding {task.task_id} refused: {e}")
            return self._failed(task, f"{type(e).__name__}: {e}")
        chunk = TokenChunk(
            model=params.model,
            text="",
            token_id=-1,
            idx=0,
            finish_reason="stop",
            usage=Usage(prompt_tokens=len(ids), completion_tokens=0),
            prompt_tokens=len(ids),
            embedding=vector,
        )
        return [
            ChunkGenerated(command_id=task.command_id, chunk=chunk),
            TaskStatusUpdated(task_id=task.task_id, task_status=TaskStatus.Complete),
        ]

    def _counted(self, task: TextGeneration, prompt_tokens: int) -> list[Event]:
        """The answer to a count-only request: one empty final chunk with the count."""
        chunk = TokenChunk(
            model=task.task_params.model,
            text="",
            token_id=-1,
            idx=0,
            finish_reason="stop",
            usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=0),
            prompt_tokens=prompt_tokens,
        )
        return [
            ChunkGenerated(command_id=task.command_id, chunk=chunk),
            TaskStatusUpdated(task_id=task.task_id, task_status=TaskStatus.Complete),
        ]

    def step(self) -> list[Event]:
        events: list[Event] = []
        for refused in self.images.admit(self.batch):
            request = self.requests.pop(refused.task_id)
            events.extend(self._failed(request.task, refused.message, refused.code))
        for out in self.batch.step():
            request = self.requests.get(TaskId(out.request_id))
            if request is None:
                continue
            if out.finish_reason == "error":
                del self.requests[request.task.task_id]
                events.extend(self._failed(request.task, out.error or "generation failed"))
                continue
            if out.token_id is None:  # max_tokens 0: the prompt alone
                events.extend(self._chunk(request, "", -1, out.finish_reason or "length"))
                continue
            request.completion_tokens += 1
            finish: FinishReason | None = out.finish_reason
            if request.context is not None and finish != "stop":
                request.context.append(out.token_id)
            self._take_logprobs(request, drop_last=finish == "stop")
            # A stop token ends the text; it is not part of it.
            text = "" if finish == "stop" else request.detokenizer.push(out.token_id)
            emitted = request.stops.push(text)
            if request.stops.stopped:
                finish = "stop"
                self.batch.cancel(out.request_id)
            elif finish is not None:
                emitted += (
                    request.stops.push(request.detokenizer.flush())
                    if not request.stops.stopped
                    else ""
                )
                emitted += request.stops.flush()
            events.extend(self._chunk(request, emitted, out.token_id, finish))
        return events

    def _take_logprobs(self, request: _Request, drop_last: bool) -> None:
        """The sampler's new entries as chunk log-probabilities (a stop token is not text)."""
        sink = request.logprob_sink
        if not sink:
            return
        entries = sink[:-1] if drop_last else list(sink)
        sink.clear()
        request.pending_logprobs.extend(map(self._logprob_entry, entries))

    def _logprob_entry(self, e: TokenLogprobs) -> TokenLogprob:
        """A sampled token's log-probability entry: its text (and bytes, where the text
        alone is part of a character), and its alternatives'."""
        text = self.engine.tokenizer.token_text
        top: list[TopLogprob] = []
        for t, lp in e.top:
            token, raw = text(t)
            top.append(TopLogprob(token=token, logprob=lp, token_bytes=raw))
        token, raw = text(e.token)
        return TokenLogprob(token=token, logprob=e.logprob, token_bytes=raw, top=top)

    def cancel(self, task_id: TaskId) -> list[Event]:
        request = self.requests.get(task_id)
        if request is None:
            return []
        if not self.images.drop(task_id):  # an encoding's result, when it comes, is dropped
            self.batch.cancel(task_id)
        return self._chunk(request, "", -1, "cancelled")

    def close(self) -> None:
        """Release the other ranks of the group (they stop following)."""
        self.images.close()
        if self.leader is not None:
            batch = self.batch
            self.leader.stop(batch.close() if isinstance(batch, PipelinedBatcher) else 0)
            self.leader = None

    def cancel_all(self) -> list[Event]:
        events: list[Event] = []
        for task_id in list(self.requests):
            events.extend(self.cancel(task_id))
        return events

    def _chunk(
        self, request: _Request, text: str, token_id: int, finish: FinishReason | None
    ) -> list[Event]:
        if not text and finish is None:
            return []  # half a character: wait for the rest
        if request.chunks_sent == 0 and request.prefix:
            text = request.prefix + text
        task = request.task
        chunk = TokenChunk(
            model=task.task_params.model,
            text=text,
            token_id=token_id,
            idx=request.chunks_sent,
            finish_reason=finish,
            usage=Usage(
                prompt_tokens=request.prompt_tokens,
                completion_tokens=request.completion_tokens,
            )
            if finish is not None
            else None,
            prompt_tokens=request.prompt_tokens if request.chunks_sent == 0 else None,
            stop_sequence=request.stops.matched if finish == "stop" else None,
            logprobs=list(request.pending_logprobs) if request.logprob_sink is not None else None,
            context=list(request.context)
            if finish is not None and request.context is not None
            else None,
            echo=self._echo(request) if finish is not None else None,
        )
        request.pending_logprobs.clear()
        request.chunks_sent += 1
        events: list[Event] = [ChunkGenerated(command_id=task.command_id, chunk=chunk)]
        if finish is not None:
            del self.requests[task.task_id]
            status = TaskStatus.Cancelled if finish == "cancelled" else TaskStatus.Complete
            events.append(TaskStatusUpdated(task_id=task.task_id, task_status=status))
        return events

    def _echo(self, request: _Request) -> EchoedPrompt | None:
        """The prompt as the model read it, for a request that asked for it (echo)."""
        ids = request.echo_ids
        if ids is None:
            return None
        tokenizer = self.engine.tokenizer
        logprobs: list[TokenLogprob] | None = None
        if request.prompt_sink is not None:
            logprobs = [self._logprob_entry(e) for e in request.prompt_sink]
        texts = [tokenizer.token_text(t) for t in ids]
        return EchoedPrompt(
            text=tokenizer.decode(ids),
            tokens=[token for token, _ in texts],
            logprobs=logprobs,
            token_bytes=[raw for _, raw in texts] if any(raw for _, raw in texts) else None,
        )

    def _failed(
        self, task: TextGeneration, message: str, code: ErrorCode | None = None
    ) -> list[Event]:
        return [
            ChunkGenerated(
                command_id=task.command_id,
                chunk=error_chunk(message, task.task_params.model, code),
            ),
            TaskStatusUpdated(
                task_id=task.task_id, task_status=TaskStatus.Failed, error_message=message
            ),
        ]


def load_generation(
    bound_instance: BoundInstance, settings: RunnerSettings, progress: Progress
) -> Generation | Follower:
    """Rank 0 (or a single runner) serves requests; other ranks follow rank 0."""
    shard = bound_instance.bound_shard
    located = locate_progress(
        shard.model_card, settings.models_dir, settings.hub_cache_dir, settings.extra_model_dirs,
        layer_range(shard),
    )
    if not isinstance(located, DownloadCompleted):
        detail = located.error_message if isinstance(located, DownloadFailed) else "not ready"
        raise FileNotFoundError(f"model files of {shard.model_card.model_id}: {detail}")
    if shard.world_size > 1:
        model, engine = load_local_model(
            Path(located.path),
            shard,
            dtype=getattr(torch, settings.dtype),
            device=settings.device,
            threads=settings.threads,
            cache_dir=settings.cache_dir,
            progress=progress,
        )
        kind: Kind = "pipeline" if isinstance(shard, PipelineShardMetadata) else "tensor"
        # a pipeline keeps a micro-batch of max_batch in flight per stage
        slots = (pipeline_slots(settings.max_batch, shard.world_size) if kind == "pipeline"
                 else settings.max_batch)  # fmt: skip
        if engine is None:
            max_seq = min(model.config.context_length, DEFAULT_MAX_SEQ)
            return Follower(model, kind, shard.device_rank, shard.world_size, slots, max_seq)
        leader = LeaderModel(model, kind, shard.world_size, slots)
        engine = Engine(
            config=engine.config, model=cast(LlamaModel, leader), tokenizer=engine.tokenizer,
            vision=engine.vision,
        )  # fmt: skip
        return Generation(engine, settings.max_batch, leader)
    # A single runner holds the whole model: a pipeline shard of every layer, or the one
    # slice of a tensor instance of one node.
    start, end = layer_range(shard)
    engine = load_engine(
        Path(located.path),
        start,
        end,
        dtype=getattr(torch, settings.dtype),
        device=settings.device,
        threads=settings.threads,
        cache_dir=settings.cache_dir,
        progress=progress,
    )
    return Generation(engine, settings.max_batch)
