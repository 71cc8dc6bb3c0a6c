"""CPU time of one batched decode step of our engine (the step a runner takes for B streams).

    python bench/batch_step.py [--rows 1 8] [--steps 32] [--context 100] [--gguf FILE] [--profile]

Loads the model (default: the embedded SmolLM2 Q4_1; `--gguf` e.g. a Gemma 3 270M Q4_K_M file)
at one thread, starts B greedy requests with prompts of `--context` tokens, and times `--steps`
decode steps of all B rows together with the process's CPU time (not wall-clock: the machine
may be shared). Reports ms of CPU per step and per token, best of `--repeat`. `--profile` adds
torch's operator profile of the last repeat (where the step's time outside the C kernels goes).
Small sizes (`--steps 4 --repeat 1`) make it a smoke run.
"""

import argparse
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# as a runner does, before torch (libgomp) loads
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from exo.worker.download.embedded import find_embedded_gguf
from exo.worker.engines.batch import BatchGenerator
from exo.worker.engines.engine import load_engine
from exo.worker.engines.sampling import SamplingParams


def time_steps(
    gen: BatchGenerator, rows: int, context: int, steps: int, around: Any = None
) -> float:
    """CPU seconds per decode step of `rows` streams (after their prefills); `around`: a context
    manager entered for the timed steps only (a profiler)."""
    for i in range(rows):
        prompt = [(17 * i + 31 * j) % 1000 + 10 for j in range(context)]
        gen.add(f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=steps + 2))
    gen.step()  # prefills + first tokens
    gen.step()  # a first decode step (warm)
    with around if around is not None else contextlib.nullcontext():
        c0 = time.process_time()
        for _ in range(steps):
            out = gen.step()
            assert len(out) == rows, "every row decodes one token per step"
        spent = time.process_time() - c0
    while gen.active:
        gen.step()
    return spent / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--context", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--gguf", type=Path)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    path: Path | None = args.gguf or find_embedded_gguf()
    if path is None:
        sys.exit("the embedded model is not installed: pass --gguf FILE")
    with tempfile.TemporaryDirectory() as tmp:
        engine = load_engine(path, threads=1, cache_dir=Path(tmp))
    print(
        f"{path.name}: CPU ms per decode step at 1 thread, context {args.context}, best of "
        f"{args.repeat} x {args.steps} steps"
    )
    for rows in args.rows:
        gen = BatchGenerator(engine.model, rows, args.context + args.steps + 8, eos_token_ids=())
        best = min(time_steps(gen, rows, args.context, args.steps) for _ in range(args.repeat))
        print(
            f"  {rows:2d} rows: {best * 1e3:7.2f} ms/step  {best * 1e3 / rows:6.2f} ms/token",
            flush=True,
        )
        if args.profile:
            from torch.profiler import ProfilerActivity, profile

            prof = profile(activities=[ProfilerActivity.CPU])
            time_steps(gen, rows, args.context, args.steps, prof)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
