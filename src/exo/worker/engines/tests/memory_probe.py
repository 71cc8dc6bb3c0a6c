"""Load a model in a fresh process and report its memory, as JSON on stdout.

    python -m exo.worker.engines.tests.memory_probe PATH MAX_BATCH MAX_SEQ

Run as its own process so resident memory (psutil) is the engine's alone: `baseline` after the
imports and kernels (a runner about to load), `peak` during the load (sampled every
millisecond), `loaded` after the model is built, `full` with the KV cache grown to
MAX_BATCH x MAX_SEQ. Also the shard's running weight bytes and its weight bytes in the file.

`load_peak`: what the load itself held at its peak, in anonymous resident memory (RSS less its
file-backed pages) over the same before-the-load figure. A first load also pages in library
code it runs for the first time (libtorch's conversions: about 9 MB, clean file pages the
system shares and may drop), which is no memory the load holds; counted in RSS it made a small
model's peak ratio swing across the 1.2x bound from run to run.
"""

import json
import sys
import threading
import time
from pathlib import Path

import psutil
import torch

import exo.worker.runner.runner as _runner  # a runner's imports count in its overhead
from exo.worker.engines.cpu_kernels import load_kernels
from exo.worker.engines.engine import load_family, load_shard_weights
from exo.worker.engines.linear import choose_weight_format
from exo.worker.engines.llama import StepInputs
from exo.worker.engines.load_report import load_plan, release_freed_memory, shard_bytes
from exo.worker.engines.model_facts import model_facts
from exo.worker.engines.models.base import BuildOptions


def _resident(proc: psutil.Process) -> tuple[int, int]:
    """(RSS, its anonymous part): the part that is not a file's pages (Linux: RSS less RssFile
    and RssShmem)."""
    info = proc.memory_info()
    return int(info.rss), int(info.rss - info.shared)


def main() -> None:
    assert _runner.__name__
    path, max_batch, max_seq = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(1)
    proc = psutil.Process()
    kernels = load_kernels()
    cpu = torch.device("cpu")
    family, config = load_family(path)
    baseline, anon_baseline = _resident(proc)
    peak, anon_peak = baseline, anon_baseline
    done = threading.Event()

    def sample() -> None:
        nonlocal peak, anon_peak
        while not done.is_set():
            rss, anon = _resident(proc)
            peak, anon_peak = max(peak, rss), max(anon_peak, anon)
            time.sleep(0.001)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.monotonic()
    plan = load_plan(cpu, torch.float32, kernels, None)
    weights = load_shard_weights(path, 0, config.n_layers, plan=plan)
    fmt = choose_weight_format(weights.source_format, cpu, torch.float32, kernels)
    # as `load_model` builds it (any family): the weights are the model's (re-laid in place)
    model = family.build(weights, BuildOptions(fmt, torch.float32, cpu, kernels=kernels,
                                               own_weights=True))  # fmt: skip
    running = shard_bytes(weights)
    del weights
    release_freed_memory()
    seconds = time.monotonic() - started
    done.set()
    sampler.join()
    loaded, anon = _resident(proc)
    peak, anon_peak = max(peak, loaded), max(anon_peak, anon)
    cache = model.new_cache(max_batch, max_seq)
    with torch.inference_mode():
        model.forward(torch.tensor([[1, 2, 3]]), StepInputs.single(0, 0, 3), cache)
    cache.prepare(tuple(range(max_batch)), (0,) * max_batch, max_seq)  # every page in use
    facts = model_facts(path)
    file_bytes, file_format = facts.weight_bytes, facts.weight_format
    report = {
        "baseline": baseline, "peak": peak, "loaded": loaded, "full": proc.memory_info().rss,
        "load_peak": anon_peak - anon_baseline,
        "running": running, "kv_bytes": cache.n_bytes, "file_bytes": file_bytes,
        "file_format": file_format, "seconds": seconds, "n_layers": config.n_layers,
        "kv_heads": config.kv_heads, "head_dim": config.head_dim, "kernels": kernels is not None,
    }  # fmt: skip
    print(json.dumps(report))


if __name__ == "__main__":
    main()
