"""The runners of one instance acting as one model over torch.distributed.

Rank 0 leads: it runs the continuous batcher exactly as a single runner does, through a
model proxy whose ``forward`` drives the other ranks. The others follow in a loop that
executes what rank 0 asks, step by step:

* pipeline: each rank holds a layer range; rank 0 embeds, activations go rank to rank,
  the last rank applies the head and sends the logits back to rank 0, over the ring of TCP
  streams ``stage_link`` opens when the group is joined (W messages a step);
* tensor: each rank holds a slice of every layer; rank 0 broadcasts the step, every rank
  runs all layers with two all-reduces per layer (after attention and after the MLP).

Every step starts with a fixed-size header (op, batch, length, lane, slots, cache starts),
so the followers' caches stay in the same layout as the leader's, moves included.

A pipeline keeps several steps in flight (``microbatch.PipelinedBatcher``: one micro-batch
per stage): a stage receives a step, computes it, and only then sends it on, so each stage
works on one micro-batch while the next stage works on another. Rank 0 reads the logits in a
thread of its own as they come, so the last stage never waits to hand them back.
"""

import os
import threading
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Literal, cast

import psutil
import torch
import torch.distributed as dist
from loguru import logger
from torch import Tensor

from exo.shared.types.worker.instances import BoundInstance
from exo.shared.types.worker.shards import PipelineShardMetadata, TensorShardMetadata
from exo.worker.engines.config import LlamaConfig
from exo.worker.engines.engine import Engine, Shard, load_model, load_vision
from exo.worker.engines.images import merge_chunk
from exo.worker.engines.kv_cache import KVCache
from exo.worker.engines.linear import WeightFormat
from exo.worker.engines.models.base import AllReduce, ShardModel, StepInputs, no_all_reduce
from exo.worker.engines.tokenizer import load_tokenizer
from exo.worker.engines.weights import ProgressCallback, TensorParallel
from exo.worker.runner.stage_images import images_meta, receive_images, send_images
from exo.worker.runner.stage_link import LogitsReader, StageLink, local_address_towards, open_link
from exo.worker.runner.stage_trace import StageTrace

Kind = Literal["pipeline", "tensor"]
_OP_STOP, _OP_FORWARD, _OP_MOVE, _OP_RELEASE = 0, 1, 2, 3
# op, batch, new tokens, (move: length; forward: 1 = every position's logits), lane,
# (forward) the length of the images' description that follows the header (0: no images)
_HEADER_FIXED = 6
_link: StageLink | None = None  # this process's place in its pipeline's ring (connect)


def connect(bound_instance: BoundInstance, timeout_s: float) -> None:
    """Join the instance's process group (gloo: CPU tensors over TCP). Gloo binds to the
    interface this machine reaches the rendezvous host through (not to whatever the
    hostname resolves to), unless ``GLOO_SOCKET_IFNAME`` says otherwise."""
    instance = bound_instance.instance
    shard = bound_instance.bound_shard
    host = instance.group_host
    url = f"tcp://{f'[{host}]' if ':' in host else host}:{instance.group_port}"
    interface = interface_towards(host)
    if interface is not None and not os.environ.get("GLOO_SOCKET_IFNAME"):
        os.environ["GLOO_SOCKET_IFNAME"] = interface
    logger.info(
        f"joining group {url} as rank {shard.device_rank}/{shard.world_size} "
        f"(interface {os.environ.get('GLOO_SOCKET_IFNAME', 'by hostname')})"
    )
    dist.init_process_group(
        "gloo",
        init_method=url,
        rank=shard.device_rank,
        world_size=shard.world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    global _link
    if isinstance(shard, PipelineShardMetadata) and shard.world_size > 1:
        _link = open_link(shard.device_rank, shard.world_size, host, timeout_s)


def pipeline_link() -> StageLink:
    """The ring ``connect`` opened for this process's pipeline."""
    if _link is None:
        raise RuntimeError("no pipeline link: the runner has not joined a pipeline group")
    return _link


def interface_towards(host: str) -> str | None:
    """The name of the interface this machine reaches ``host`` through (a UDP socket's
    route lookup: nothing is sent); None when there is no route."""
    local = local_address_towards(host)
    if local is None:
        return None
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address.split("%", 1)[0] == local for a in addrs):
            return name
    return None


def _all_reduce(x: Tensor) -> Tensor:
    dist.all_reduce(x)
    return x


@dataclass
class _Header:
    max_batch: int

    @property
    def length(self) -> int:
        return _HEADER_FIXED + 3 * self.max_batch  # slots, starts, M-RoPE deltas

    def encode(self, op: int, step: StepInputs | None = None, move: tuple[int, int, int] = (0, 0, 0),
               every_position: bool = False, lane: int = 0, images: int = 0) -> Tensor:
        h = torch.zeros(self.length, dtype=torch.int64)
        h[0] = op
        if step is not None:
            b = len(step.slots)
            h[1], h[2], h[3], h[4], h[5] = b, step.n_new, int(every_position), lane, images
            h[_HEADER_FIXED : _HEADER_FIXED + b] = torch.tensor(step.slots)
            h[_HEADER_FIXED + self.max_batch : _HEADER_FIXED + self.max_batch + b] = torch.tensor(step.starts)
            if step.rope_deltas:
                at = _HEADER_FIXED + 2 * self.max_batch
                h[at : at + b] = torch.tensor(step.rope_deltas)
        else:
            h[1], h[2], h[3] = move
        return h

    def decode_step(self, h: Tensor) -> StepInputs:
        b, n_new = int(h[1]), int(h[2])
        slots = tuple(int(v) for v in h[_HEADER_FIXED : _HEADER_FIXED + b])
        starts = tuple(int(v) for v in h[_HEADER_FIXED + self.max_batch : _HEADER_FIXED + self.max_batch + b])
        at = _HEADER_FIXED + 2 * self.max_batch
        deltas = tuple(int(v) for v in h[at : at + b])
        return StepInputs(slots, starts, n_new, rope_deltas=deltas if any(deltas) else ())


class _LeaderCache:
    """Rank 0's cache: a slot move or release is mirrored on every rank before it happens here."""

    def __init__(self, local: KVCache, leader: "LeaderModel") -> None:
        self.local = local
        self.leader = leader

    def move_slot(self, src: int, dst: int, length: int) -> None:
        self.leader.send_header(self.leader.header.encode(_OP_MOVE, move=(src, dst, length)))
        self.local.move_slot(src, dst, length)

    def release(self, slot: int) -> None:
        self.leader.send_header(self.leader.header.encode(_OP_RELEASE, move=(slot, 0, 0)))
        self.local.release(slot)


class _Received:
    """The logits of a step sent down the pipeline, which rank 0's reader takes in."""

    def __init__(self, reader: LogitsReader, step: int) -> None:
        self.reader, self.step = reader, step

    def wait(self) -> Tensor:
        return self.reader.take(self.step)


class LeaderModel:
    """What the batcher sees on rank 0: a whole model whose forward spans every rank (and,
    for a pipeline, the ``microbatch.PipelineHead`` that keeps several steps in flight)."""

    def __init__(self, local: ShardModel, kind: Kind, world_size: int, max_batch: int) -> None:
        self.local = local
        self.kind: Kind = kind
        self.world_size = world_size
        self.header = _Header(max_batch)
        self.config: LlamaConfig = local.config
        self.device = local.device
        self.start_layer = 0
        self.end_layer = local.config.n_layers
        self.weight_format: WeightFormat = local.weight_format
        self.trace = StageTrace(0)
        self.link = pipeline_link() if kind == "pipeline" else None
        self.logits = LogitsReader(self.link) if self.link is not None else None

    def send_header(self, header: Tensor) -> None:
        if self.link is None:
            dist.broadcast(header, src=0)
        else:
            self.link.send(header)

    def new_cache(self, max_batch: int, max_seq: int) -> KVCache:
        return cast(KVCache, _LeaderCache(self.local.new_cache(max_batch, max_seq), self))

    def new_local_cache(self, max_batch: int, max_seq: int) -> KVCache:
        return self.local.new_cache(max_batch, max_seq)

    def mirror_move(self, src: int, dst: int, length: int) -> None:
        self.send_header(self.header.encode(_OP_MOVE, move=(src, dst, length)))

    def mirror_release(self, slot: int) -> None:
        self.send_header(self.header.encode(_OP_RELEASE, move=(slot, 0, 0)))

    def forward(self, tokens: Tensor, step: StepInputs, cache: KVCache,
                every_position: bool = False) -> Tensor:
        """The whole model's logits: of each row's last position [B, V], or of every
        position [B, T, V] (the last stage computes them and sends them here)."""
        local_cache = cast(_LeaderCache, cache).local
        if self.kind == "tensor":
            if step.images is not None:
                raise RuntimeError("images are not served by a tensor-parallel instance yet")
            self.send_header(self.header.encode(_OP_FORWARD, step, every_position=every_position))
            dist.broadcast(tokens.to(torch.int64).contiguous(), src=0)
            return self.local.forward(tokens, step, local_cache, every_position)
        return self.launch(tokens, step, step, local_cache, every_position, 0).wait()

    def launch(self, tokens: Tensor, local: StepInputs, routed: StepInputs, cache: KVCache,
               every_position: bool, lane: int) -> _Received:
        """Stage 0 of a pipeline step, sent on once computed (so a busy stage 1 does not hold
        this stage up), with the receive of its logits posted at once."""
        with self.trace.timed(lane):
            hidden = merge_chunk(self.local.embed(tokens), local.images)  # the images go in here
            hidden = self.local.forward_layers(hidden, local, cache)
        assert self.link is not None and self.logits is not None
        meta = images_meta(routed.images)
        header = self.header.encode(_OP_FORWARD, routed, every_position=every_position, lane=lane,
                                    images=meta.numel())  # fmt: skip
        rows = (len(routed.slots), routed.n_new) if every_position else (len(routed.slots),)
        step = self.logits.expect((*rows, self.config.vocab))
        if routed.images is None:
            self.link.send(header, hidden)
        else:
            self.link.send(header)
            send_images(routed.images, meta, self.link)
            self.link.send(hidden)
        return _Received(self.logits, step)

    def final_hidden(self, tokens: Tensor) -> Tensor:
        """Embeddings need the whole model in one process: refused for a split one."""
        raise RuntimeError(
            f"embeddings are not served by a model split over {self.world_size} ranks "
            f"({self.kind} parallel)"
        )

    def stop(self, held_slots: int = 0) -> None:
        self.send_header(self.header.encode(_OP_STOP))
        if self.logits is not None:
            self.logits.close()
        if self.kind == "pipeline":
            self.trace.held_slots = held_slots
            logger.info(f"pipeline trace: {self.trace.summary()}")
            self.trace.save_if_asked()


class Follower:
    """Ranks > 0: execute rank 0's steps until it says stop (or the group breaks)."""

    def __init__(self, local: ShardModel, kind: Kind, rank: int, world_size: int,
                 max_batch: int, max_seq: int) -> None:
        self.local = local
        self.kind: Kind = kind
        self.rank = rank
        self.world_size = world_size
        self.header = _Header(max_batch)
        self.cache = local.new_cache(max_batch, max_seq)
        self.error: BaseException | None = None
        self.trace = StageTrace(rank)
        self.link = pipeline_link() if kind == "pipeline" else None
        self.finished = threading.Event()
        self._thread = threading.Thread(target=self._run, name="exo-follower", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            with torch.inference_mode():
                while self._serve_one():
                    pass
        except BaseException as e:  # reported by the runner's main loop
            self.error = e
        finally:
            self.trace.held_slots = sum(1 for pages in self.cache.table if pages)
            if self.kind == "pipeline":
                logger.info(f"pipeline trace: {self.trace.summary()}")
            self.trace.save_if_asked()
            self.finished.set()

    def _receive_header(self) -> Tensor:
        header = torch.empty(self.header.length, dtype=torch.int64)
        if self.link is None:
            dist.broadcast(header, src=0)
        else:
            self.link.recv_into(header)
        return header

    def _pass_on(self, header: Tensor) -> None:
        if self.link is not None and self.rank < self.world_size - 1:
            self.link.send(header)

    def _serve_one(self) -> bool:
        header = self._receive_header()
        op = int(header[0])
        if op != _OP_FORWARD:
            self._pass_on(header)
        if op == _OP_STOP:
            return False
        if op == _OP_MOVE:
            self.cache.move_slot(int(header[1]), int(header[2]), int(header[3]))
            return True
        if op == _OP_RELEASE:
            self.cache.release(int(header[1]))
            return True
        step = self.header.decode_step(header)
        batch = len(step.slots)
        if int(header[5]) > 0:  # the chunk's images (spans, positions, features) come first
            assert self.link is not None  # (a tensor instance takes no images)
            step = replace(step, images=receive_images(int(header[5]), step.n_new,
                                                       self.local.config.hidden, self.local.dtype,
                                                       self.link))  # fmt: skip
        if self.kind == "tensor":
            tokens = torch.empty(batch, step.n_new, dtype=torch.int64)
            dist.broadcast(tokens, src=0)
            self.local.forward(tokens, step, self.cache)
            return True
        assert self.link is not None
        hidden = torch.empty(batch, step.n_new, self.local.config.hidden, dtype=self.local.dtype)
        self.link.recv_into(hidden)
        last = self.rank == self.world_size - 1
        with self.trace.timed(int(header[4])):
            hidden = self.local.forward_layers(hidden, step, self.cache)
            if last:
                hidden = self.local.head(hidden if bool(header[3]) else hidden[:, -1])
        if last:  # the logits, to rank 0
            self.link.send(hidden.to(torch.float32))
        elif step.images is None:  # once computed: the next stage may still be busy
            self.link.send(header, hidden)
        else:
            self.link.send(header)
            send_images(step.images, images_meta(step.images), self.link)
            self.link.send(hidden)
        return True


def load_local_model(
    path: Path,
    shard: PipelineShardMetadata | TensorShardMetadata,
    *,
    dtype: torch.dtype,
    device: str,
    threads: int,
    cache_dir: Path,
    progress: ProgressCallback | None,
) -> tuple[ShardModel, Engine | None]:
    """This rank's part of the model, through the one loader; rank 0 also gets the tokenizer
    (as an Engine)."""
    all_reduce: AllReduce = no_all_reduce
    if isinstance(shard, PipelineShardMetadata):
        local = Shard(shard.start_layer, shard.end_layer)
    else:  # each layer is sliced as it loads: the rank never holds the whole model
        local = Shard(tensor_parallel=TensorParallel(shard.device_rank, shard.world_size))
        all_reduce = _all_reduce
    config, model = load_model(
        path, local, all_reduce=all_reduce, dtype=dtype, device=device, threads=threads,
        cache_dir=cache_dir, progress=progress,
    )  # fmt: skip
    if shard.device_rank != 0:
        return model, None
    # the first stage runs a vision model's image path (a tensor instance takes no images)
    vision = load_vision(path) if isinstance(shard, PipelineShardMetadata) else None
    tokenizer = load_tokenizer(path, cache_dir)
    return model, Engine(config=config, model=model, tokenizer=tokenizer, vision=vision)
