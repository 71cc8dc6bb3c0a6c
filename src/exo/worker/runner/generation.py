"""Serving requests on a loaded engine: continuous batching, text, stops and chunks.

The runner calls ``submit`` for each request, ``step`` between its input checks, and
``cancel``; each returns the events to send (chunks and task statuses)."""

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import torch
from loguru import logger

from exo.shared.types.chunks import ErrorChunk, FinishReason, TokenChunk, Usage
from exo.shared.types.events import ChunkGenerated, Event, TaskStatusUpdated
from exo.shared.types.tasks import TaskId, TaskStatus, TextGeneration
from exo.shared.types.worker.downloads import DownloadCompleted, DownloadFailed
from exo.shared.types.worker.instances import BoundInstance
from exo.shared.types.worker.shards import PipelineShardMetadata
from exo.worker.download.local import locate_model
from exo.worker.engines.engine import DEFAULT_MAX_SEQ, Engine, load_engine
from exo.worker.engines.llama import LlamaModel
from exo.worker.engines.sampling import SamplingParams
from exo.worker.engines.text import IncrementalDetokenizer, StopMatcher
from exo.worker.runner.distributed import Follower, Kind, LeaderModel, load_local_model
from exo.worker.runner.settings import RunnerSettings

Progress = Callable[[int, int], None]


@dataclass
class _Request:
    task: TextGeneration
    detokenizer: IncrementalDetokenizer
    stops: StopMatcher
    prompt_tokens: int
    completion_tokens: int = 0
    chunks_sent: int = 0
    started: float = field(default_factory=time.perf_counter)


class Generation:
    def __init__(self, engine: Engine, max_batch: int, leader: LeaderModel | None = None) -> None:
        self.engine = engine
        self.leader = leader
        self.max_seq = min(engine.config.context_length, DEFAULT_MAX_SEQ)
        self.batch = engine.batch_generator(max_batch, self.max_seq)
        self.requests: dict[TaskId, _Request] = {}
        self.max_batch = max_batch

    @property
    def active(self) -> int:
        return len(self.requests)

    def warmup(self) -> None:
        self.engine.warmup()

    def submit(self, task: TextGeneration) -> list[Event]:
        params = task.task_params
        tokenizer = self.engine.tokenizer
        try:
            if params.raw_prompt is not None:
                prompt = params.raw_prompt
            else:
                prompt = tokenizer.render_chat(
                    [{"role": m.role, "content": m.content} for m in params.input]
                )
            # A raw prompt gets the BOS the model asks for; a chat template writes its own.
            prompt_ids = tokenizer.encode(prompt, add_special_tokens=params.raw_prompt is not None)
            limit = self.max_seq
            if len(prompt_ids) >= limit:
                raise ValueError(
                    f"prompt is {len(prompt_ids)} tokens; this runner's context is {limit}"
                )
            max_tokens = min(params.max_tokens or limit, limit - len(prompt_ids))
            self.batch.add(
                task.task_id,
                prompt_ids,
                SamplingParams(
                    temperature=params.temperature,
                    top_p=params.top_p,
                    top_k=params.top_k,
                    min_p=params.min_p,
                    seed=params.seed,
                    max_tokens=max_tokens,
                    repetition_penalty=params.repetition_penalty,
                    presence_penalty=params.presence_penalty,
                    frequency_penalty=params.frequency_penalty,
                ),
            )
        except Exception as e:  # this request is refused; the others go on
            logger.warning(f"request {task.task_id} refused: {e}")
            return self._failed(task, f"{type(e).__name__}: {e}")
        self.requests[task.task_id] = _Request(
            task=task,
            detokenizer=IncrementalDetokenizer(tokenizer.decode, prompt_ids),
            stops=StopMatcher(params.stop),
            prompt_tokens=len(prompt_ids),
        )
        return []

    def step(self) -> list[Event]:
        events: list[Event] = []
        for out in self.batch.step():
            request = self.requests.get(TaskId(out.request_id))
            if request is None:
                continue
            if out.finish_reason == "error" or out.token_id is None:
                del self.requests[request.task.task_id]
                events.extend(self._failed(request.task, out.error or "generation failed"))
                continue
            request.completion_tokens += 1
            finish: FinishReason | None = out.finish_reason
            # A stop token ends the text; it is not part of it.
            text = "" if finish == "stop" else request.detokenizer.push(out.token_id)
            emitted = request.stops.push(text)
            if request.stops.stopped:
                finish = "stop"
                self.batch.cancel(out.request_id)
            elif finish is not None:
                emitted += request.stops.push(request.detokenizer.flush()) if not request.stops.stopped else ""
                emitted += request.stops.flush()
            events.extend(self._chunk(request, emitted, out.token_id, finish))
        return events

    def cancel(self, task_id: TaskId) -> list[Event]:
        request = self.requests.get(task_id)
        if request is None:
            return []
        self.batch.cancel(task_id)
        return self._chunk(request, "", -1, "cancelled")

    def close(self) -> None:
        """Release the other ranks of the group (they stop following)."""
        if self.leader is not None:
            self.leader.stop()
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
        )
        request.chunks_sent += 1
        events: list[Event] = [ChunkGenerated(command_id=task.command_id, chunk=chunk)]
        if finish is not None:
            del self.requests[task.task_id]
            status = TaskStatus.Cancelled if finish == "cancelled" else TaskStatus.Complete
            events.append(TaskStatusUpdated(task_id=task.task_id, task_status=status))
        return events

    def _failed(self, task: TextGeneration, message: str) -> list[Event]:
        return [
            ChunkGenerated(
                command_id=task.command_id,
                chunk=ErrorChunk(model=task.task_params.model, error_message=message),
            ),
            TaskStatusUpdated(task_id=task.task_id, task_status=TaskStatus.Failed,
                              error_message=message),
        ]


def load_generation(
    bound_instance: BoundInstance, settings: RunnerSettings, progress: Progress
) -> Generation | Follower:
    """Rank 0 (or a single runner) serves requests; other ranks follow rank 0."""
    shard = bound_instance.bound_shard
    located = locate_model(shard.model_card, settings.models_dir)
    if not isinstance(located, DownloadCompleted):
        detail = located.error_message if isinstance(located, DownloadFailed) else "not ready"
        raise FileNotFoundError(f"model files of {shard.model_card.model_id}: {detail}")
    if shard.world_size > 1:
        model, engine = load_local_model(
            Path(located.path), shard, dtype=getattr(torch, settings.dtype),
            device=settings.device, threads=settings.threads, cache_dir=settings.cache_dir,
            progress=progress,
        )
        kind: Kind = "pipeline" if isinstance(shard, PipelineShardMetadata) else "tensor"
        if engine is None:
            max_seq = min(model.config.context_length, DEFAULT_MAX_SEQ)
            return Follower(model, kind, shard.device_rank, shard.world_size,
                            settings.max_batch, max_seq)
        leader = LeaderModel(model, kind, shard.world_size, settings.max_batch)
        engine = Engine(config=engine.config, model=cast(LlamaModel, leader),
                        tokenizer=engine.tokenizer)
        return Generation(engine, settings.max_batch, leader)
    # A single runner holds the whole model: a pipeline shard of every layer, or the one
    # slice of a tensor instance of one node.
    if isinstance(shard, PipelineShardMetadata):
        start, end = shard.start_layer, shard.end_layer
    else:
        start, end = 0, shard.model_card.n_layers
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
