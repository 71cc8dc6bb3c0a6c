"""The facade a runner uses: load a model file into an `Engine`, then batch-generate tokens."""

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch

from exo.shared.constants import EXO_MAX_CONTEXT_TOKENS
from exo.worker.engines.batch import BatchGenerator
from exo.worker.engines.config import LlamaConfig
from exo.worker.engines.cpu_kernels import load_kernels
from exo.worker.engines.gguf_loader import (
    gguf_config,
    gguf_family,
    load_gguf_config,
    load_gguf_shard,
)
from exo.worker.engines.gguf_reader import GGUFFile
from exo.worker.engines.images import VisionEncoder
from exo.worker.engines.linear import WeightFormat, choose_weight_format
from exo.worker.engines.load_report import load_plan, log_load, release_freed_memory
from exo.worker.engines.materialise import StoragePlan
from exo.worker.engines.models.base import (
    AllReduce,
    BuildOptions,
    EngineModel,
    ShardModel,
    no_all_reduce,
)
from exo.worker.engines.models.gguf_vision import load_gguf_vision
from exo.worker.engines.models.registry import VISION_LOADERS, Family
from exo.worker.engines.safetensors_loader import hf_config, hf_family, load_hf_shard
from exo.worker.engines.sampling import SamplingParams
from exo.worker.engines.tokenizer import EngineTokenizer, load_tokenizer
from exo.worker.engines.weights import ProgressCallback, ShardWeights, TensorParallel

# Default positions per request. The KV cache grows in pages as tokens are cached, up to
# max_batch x max_seq positions of every layer: for SmolLM2-135M (float32) 46 KB per position,
# 94 MB for a full 2048-position slot. The API advertises the same figure (served model cards),
# so both come from one constant.
DEFAULT_MAX_SEQ = EXO_MAX_CONTEXT_TOKENS


def rows_apart(model: object) -> bool:
    """Whether each row of a forward computes as it would alone, bit for bit, at any row count:
    every linear of the model runs a C kernel (one accumulation order per row in every
    strategy); `F.linear`'s results move with the number of rows. Such a model's batcher packs
    prompt chunks at the same positions into one forward (`batch.py`)."""
    used: object = getattr(model, "kernels_used", None)  # a pipeline or tensor leader: none
    if not callable(used):
        return False
    names = cast(dict[str, int], used())
    return bool(names) and all(
        "C kernel" in part and "dequantised" not in part
        for name in names
        for part in name.split(" + ")
    )


def load_config(path: Path) -> LlamaConfig:
    """The model shape of a GGUF file or a Hugging Face folder."""
    return hf_config(path) if path.is_dir() else load_gguf_config(path)


def load_family(path: Path) -> tuple[Family, LlamaConfig]:
    """The architecture family and model shape of a GGUF file or a Hugging Face folder."""
    if path.is_dir():
        return hf_family(path), hf_config(path)
    f = GGUFFile(path)
    try:
        return gguf_family(f), gguf_config(f)
    finally:
        f.close()


def load_vision(path: Path, dtype: torch.dtype = torch.float32) -> VisionEncoder | None:
    """The image path of a vision model (its tower and projector; for the first pipeline
    stage); None for a model without one."""
    if not path.is_dir():  # a GGUF model's tower is in the mmproj file beside it
        return load_gguf_vision(path, dtype)
    loader = VISION_LOADERS.get(hf_family(path).name)
    return None if loader is None else loader(path, dtype)


def load_shard_weights(
    path: Path,
    start_layer: int,
    end_layer: int,
    *,
    dtype: torch.dtype = torch.float32,
    progress: ProgressCallback | None = None,
    plan: StoragePlan | None = None,
    tensor_parallel: TensorParallel | None = None,
) -> ShardWeights:
    """Layers [start_layer, end_layer) of a GGUF file or a Hugging Face safetensors folder,
    held as `plan` says (default: plain tensors in `dtype`), sliced per layer for a TP rank."""
    load = load_hf_shard if path.is_dir() else load_gguf_shard
    return load(
        path, start_layer, end_layer, dtype=dtype, progress=progress, plan=plan,
        tensor_parallel=tensor_parallel,
    )  # fmt: skip


@dataclass
class Engine:
    """A loaded model (or layer range of one) with its tokenizer. Not thread-safe: one runner
    thread drives it."""

    config: LlamaConfig
    model: EngineModel
    tokenizer: EngineTokenizer
    vision: VisionEncoder | None = None  # a vision model's image path (first stage only)

    @property
    def is_full_model(self) -> bool:
        return self.model.start_layer == 0 and self.model.end_layer == self.config.n_layers

    def batch_generator(
        self,
        max_batch: int = 1,
        max_seq: int | None = None,
        *,
        prefill_chunk: int = 512,
        prefill_turn: int | None = None,
    ) -> BatchGenerator:
        """A continuous batcher of up to `max_batch` requests of up to `max_seq` tokens each
        (prompt and output; default: min(context length, DEFAULT_MAX_SEQ)); `prefill_turn`:
        the prompt tokens a step prefills (`BatchGenerator`)."""
        if not self.is_full_model:
            raise RuntimeError("batch generation needs the whole model in this engine")
        seq = max_seq if max_seq is not None else min(self.config.context_length, DEFAULT_MAX_SEQ)
        eos = set(self.config.eos_token_ids) | set(self.tokenizer.eos_token_ids)
        return BatchGenerator(
            self.model, max_batch, seq, eos_token_ids=sorted(eos), prefill_chunk=prefill_chunk,
            pack_prefill=rows_apart(self.model), prefill_turn=prefill_turn,
        )  # fmt: skip

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[int]:
        """Tokens of one request (stop token excluded); a convenience over `batch_generator`."""
        gen = self.batch_generator(
            1, min(self.config.context_length, len(prompt_ids) + params.max_tokens + 1)
        )
        gen.add("generate", prompt_ids, params)
        while gen.active:
            for out in gen.step():
                if out.finish_reason == "error":
                    raise RuntimeError(out.error)
                if out.token_id is not None and out.finish_reason != "stop":
                    yield out.token_id

    def embedding(self, ids: list[int]) -> list[float]:
        """The mean of the final hidden states (after the final norm) over `ids`, scaled to
        unit length: a sentence vector of `config.hidden` floats."""
        if not self.is_full_model:
            raise RuntimeError("embeddings need the whole model in this engine")
        if not ids:
            raise ValueError("nothing to embed: no tokens")
        with torch.inference_mode():
            hidden = self.model.final_hidden(torch.tensor([ids], dtype=torch.long))
            mean = hidden.mean(dim=0)
            vector = torch.nn.functional.normalize(mean, dim=0)
        return [float(x) for x in vector.tolist()]

    def warmup(self) -> None:
        """Run every code path once (prefill, batched decode, sampling) on a scratch cache."""
        if not self.is_full_model:
            return
        gen = self.batch_generator(2, 16)
        gen.add("warmup-0", [1, 2, 3, 4], SamplingParams(temperature=0.0, max_tokens=3))
        gen.add(
            "warmup-1", [5, 6, 7], SamplingParams(temperature=0.7, top_p=0.9, seed=0, max_tokens=3)
        )
        while gen.active:
            gen.step()


@dataclass(frozen=True)
class Shard:
    """What of a model this process holds: layers [start_layer, end_layer) (None: to the
    last), each sliced for a tensor-parallel rank when `tensor_parallel` is given."""

    start_layer: int = 0
    end_layer: int | None = None
    tensor_parallel: TensorParallel | None = None


def load_model(
    path: Path,
    shard: Shard | None = None,
    *,
    all_reduce: AllReduce = no_all_reduce,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    threads: int = 1,
    cache_dir: Path,
    progress: ProgressCallback | None = None,
    weight_format: WeightFormat | None = None,
) -> tuple[LlamaConfig, ShardModel]:
    """The one recipe for every shard kind: the family of the file, its config, the shard's
    weights (sliced as they load for a tensor-parallel rank), the model built from them by
    its family, and one log line. `all_reduce` sums a tensor-parallel rank's partial outputs.

    `threads` sizes torch's intra-op pool (the caller knows its share of the machine);
    `weight_format` defaults to the fastest that keeps the file's precision (`linear.py`).
    On a CPU, float32 activations are the fast path (bfloat16 / float16 are slow without
    AVX-512); `dtype` is also the KV cache dtype.
    """
    torch.set_num_threads(max(1, threads))
    dev = torch.device(device)
    shard = shard or Shard()
    family, config = load_family(path)
    end = config.n_layers if shard.end_layer is None else shard.end_layer
    on_cpu_f32 = dev.type == "cpu" and dtype == torch.float32
    kernels = load_kernels(cache_dir / "kernels") if on_cpu_f32 else None
    if kernels is not None:
        kernels.set_threads(max(1, threads))
    load_dtype = torch.float32 if on_cpu_f32 else dtype
    started = time.monotonic()
    plan = load_plan(dev, load_dtype, kernels, weight_format)
    weights = load_shard_weights(
        path, shard.start_layer, end, dtype=load_dtype, progress=progress, plan=plan,
        tensor_parallel=shard.tensor_parallel,
    )  # fmt: skip
    fmt = weight_format or choose_weight_format(weights.source_format, dev, dtype, kernels)
    # the weights were loaded for this model alone: it may re-lay their blocks in place
    options = BuildOptions(fmt, dtype, dev, all_reduce, kernels, own_weights=True)
    model = family.build(weights, options)
    release_freed_memory()
    log_load(path, weights, model, time.monotonic() - started)
    return config, model


def load_engine(
    path: Path,
    start_layer: int = 0,
    end_layer: int | None = None,
    *,
    shard: Shard | None = None,
    all_reduce: AllReduce = no_all_reduce,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    threads: int = 1,
    cache_dir: Path,
    progress: ProgressCallback | None = None,
    weight_format: WeightFormat | None = None,
) -> Engine:
    """Load `shard` (default: layers [start_layer, end_layer), all by default) of a GGUF file
    or HF folder with its tokenizer (`load_model` says how)."""
    config, model = load_model(
        path, shard or Shard(start_layer, end_layer), all_reduce=all_reduce, dtype=dtype, device=device, threads=threads,
        cache_dir=cache_dir, progress=progress, weight_format=weight_format,
    )  # fmt: skip
    start = (shard or Shard(start_layer, end_layer)).start_layer
    vision = load_vision(path) if start == 0 else None
    tokenizer = load_tokenizer(path, cache_dir)
    return Engine(config=config, model=model, tokenizer=tokenizer, vision=vision)
