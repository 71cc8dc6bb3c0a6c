"""CPU time of one batched decode step of our engine (the step a runner takes for B streams).

    python bench/batch_step.py [--rows 1 8] [--steps 32] [--context 100] [--gguf FILE] [--profile]

Loads the model (default: the embedded SmolLM2 Q4_1; `--gguf` e.g. a Gemma 3 270M Q4_K_M file)
at one thread, starts B greedy requests with prompts of `--context` tokens, and times `--steps`
decode steps of all B rows together with the process's CPU time (not wall-clock: the machine
may be shared). Reports ms of CPU per step and per token, best of `--repeat`. `--profile` adds
torch's operator profile of the last repeat (where the step's time outside the C kernels goes).
Small sizes (`--steps 4 --repeat 1`) make it a smoke run.

`--split` adds where each step's CPU time goes: each C linear by its weight shape (N x K: the
head, gate/up, ...), the decode attention kernel, and the rest (Python, torch ops, sampling).

`--serve TOKENS` measures instead what `bench/serve.py` does through HTTP, in CPU time: B chat
prompts as serve.py's client sends them (distinct, started together), each prefilled and
answered with TOKENS tokens (EOS ignored); B streams' aggregate tokens per CPU second against
one stream's decode rate (after its first token). Issue 22's target is 8 streams >= 3x one.
"""

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

# as a runner does, before torch (libgomp) loads
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from torch import Tensor

from exo.worker.download.embedded import find_embedded_gguf
from exo.worker.engines.batch import BatchGenerator
from exo.worker.engines.cpu_kernels import QKernels, QuantWeights
from exo.worker.engines.engine import Engine, load_engine, rows_apart
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


def serve_shaped(engine: Engine, rows: int, tokens: int) -> tuple[float, float]:
    """CPU seconds of `rows` serve.py-like streams of `tokens` tokens: (prefill and first
    tokens, the remaining decode steps)."""
    topic = "how a lighthouse keeper spends a long winter night, and what the light means to ships"
    gen = BatchGenerator(engine.model, 8, 2048, pack_prefill=rows_apart(engine.model))
    for i in range(rows):
        text = f"Request {i}. In a few paragraphs, describe {topic}."
        prompt = engine.tokenizer.encode_chat([{"role": "user", "content": text}])
        gen.add(
            f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
        )
    c0 = time.process_time()
    first: set[str] = set()
    while len(first) < rows:  # every stream has its first token
        first |= {o.request_id for o in gen.step()}
    c1 = time.process_time()
    while gen.active:
        gen.step()
    return c1 - c0, time.process_time() - c1


@contextlib.contextmanager
def kernel_split(spent: dict[str, float]) -> Generator[None]:
    """Add each C linear's (by weight shape) and the decode attention's CPU seconds to `spent`
    while inside."""
    linear, attend = QKernels.linear, QKernels.attend_decode

    def timed_linear(
        self: QKernels, w: QuantWeights, x: Tensor, residual: Tensor | None = None
    ) -> Tensor:
        c = time.thread_time()
        try:
            return linear(self, w, x, residual)
        finally:
            key = f"linear {w.n}x{w.k}"
            spent[key] = spent.get(key, 0.0) + time.thread_time() - c

    def timed_attend(self: QKernels, *args: Any, **kwargs: Any) -> Tensor:
        c = time.thread_time()
        try:
            return attend(self, *args, **kwargs)
        finally:
            spent["attention"] = spent.get("attention", 0.0) + time.thread_time() - c

    QKernels.linear, QKernels.attend_decode = timed_linear, timed_attend  # pyright: ignore[reportAttributeAccessIssue]
    try:
        yield
    finally:
        QKernels.linear, QKernels.attend_decode = linear, attend  # pyright: ignore[reportAttributeAccessIssue]


def report_split(gen: BatchGenerator, rows: int, context: int, steps: int) -> None:
    spent: dict[str, float] = {}
    per_step = time_steps(gen, rows, context, steps, kernel_split(spent)) * 1e3
    parts = sorted(((v * 1e3 / steps, k) for k, v in spent.items()), reverse=True)
    rest = per_step - sum(ms for ms, _ in parts)
    print("       " + ", ".join(f"{k} {ms:.2f}" for ms, k in parts) + f", rest {rest:.2f} ms")


def _total(spent: tuple[float, float]) -> float:
    return spent[0] + spent[1]


def report_serve(engine: Engine, tokens: int, repeat: int) -> None:
    print(f"serve-shaped: streams of {tokens} tokens, CPU time at 1 thread, best of {repeat}")
    single = batch = (float("inf"), float("inf"))
    for _ in range(repeat):  # interleaved, each the best of its runs
        single = min(single, serve_shaped(engine, 1, tokens), key=_total)
        batch = min(batch, serve_shaped(engine, 8, tokens), key=_total)
    alone = (tokens - 1) / single[1]
    together = 8 * tokens / sum(batch)
    print(f"  1 stream: prefill {single[0] * 1e3:.0f} ms, decode {alone:.1f} tok/s")
    print(f"  8 streams: prefill {batch[0] * 1e3:.0f} ms, decode {batch[1] * 1e3:.0f} ms, "
          f"aggregate {together:.1f} tok/s")  # fmt: skip
    print(f"  8 streams aggregate / single-stream decode: {together / alone:.2f}x", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--context", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--gguf", type=Path)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--split", action="store_true", help="CPU per step: kernels and the rest")
    ap.add_argument("--serve", type=int, metavar="TOKENS", help="serve.py's load, in CPU time")
    args = ap.parse_args()
    path: Path | None = args.gguf or find_embedded_gguf()
    if path is None:
        sys.exit("the embedded model is not installed: pass --gguf FILE")
    with tempfile.TemporaryDirectory() as tmp:
        engine = load_engine(path, threads=1, cache_dir=Path(tmp))
    if args.serve is not None:
        report_serve(engine, args.serve, args.repeat)
        return
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
        if args.split:
            report_split(gen, rows, args.context, args.steps)
        if args.profile:
            from torch.profiler import ProfilerActivity, profile

            prof = profile(activities=[ProfilerActivity.CPU])
            time_steps(gen, rows, args.context, args.steps, prof)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
