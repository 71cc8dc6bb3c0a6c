"""Mixture-of-experts speed against llama.cpp, load peak and placement's estimate, on generated
files of the flagships' real per-layer shapes.

    python bench/moe.py [--threads 1] [--files qwen3moe,gpt-oss,deepseek2] [--layers N] \
        [--new-tokens 32] [--repeat 2]

For each family (exo.modelgen's `real-layer` shape: Qwen3-30B-A3B's block in Q4_K_M, about 3 GB
at its default 8 layers; gpt-oss-20b's in MXFP4 (experts MXFP4, the rest Q8_0); DeepSeek V3's
in Q4_K_M with 32 experts), generated into a temporary folder and removed after:
* decode and prefill tokens/s of (a) our engine and (c) llama.cpp through llama-cpp-python on the
  same file, prompt and threads, as `bench/engine.py` measures them (its functions). The native
  build row needs LLAMA_CPP_LIB_PATH (bench/build_llama_cpp.sh builds it); the wheel's own
  library is run in a child process without it, or skipped with a line where the wheel was
  installed without one (LLAMA_BUILD=OFF);
* `a/c: decode N.NNx, prefill N.NNx` per file and build (the Qwen3-MoE native line first), with
  a summary of every line at the end;
* load peak (anonymous resident memory, `memory_probe`'s `load_peak`) over the running
  weights, and placement's estimate (`card_estimate`) over the runner's RSS with its KV cache
  grown (`bench/load.py`'s probe: a fresh process).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from importlib.util import find_spec
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as bench/engine.py, before torch loads

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import (  # bench/engine.py
    QUESTION,
    Result,
    bench_llama_cpp,
    bench_ours,
    best,
    load_llama_cpp,
)
from load import probe  # bench/load.py

from exo.master.placement_memory import card_estimate
from exo.modelgen import Request, generate
from exo.worker.download.local import card_from_path
from exo.worker.engines.engine import load_engine

QUANTS = {"qwen3moe": "Q4_K_M", "gpt-oss": "MXFP4", "deepseek2": "Q4_K_M"}
MiB = 2**20


def _prompt(path: Path, threads: int, cache: Path) -> list[int]:
    engine = load_engine(path, threads=threads, cache_dir=cache)
    return engine.tokenizer.encode_chat([{"role": "user", "content": QUESTION}])


def ours(path: Path, args: argparse.Namespace, prompt: list[int], cache: Path) -> Result:
    engine = load_engine(path, threads=args.threads, cache_dir=cache)
    name = f"(a) exo engine [{engine.model.weight_format}]"
    run = lambda: bench_ours(engine, name, prompt, args.new_tokens)  # noqa: E731
    run()
    return best([run() for _ in range(args.repeat)])


def llama_cpp(path: Path, args: argparse.Namespace, prompt: list[int]) -> Result | None:
    llm = load_llama_cpp(path, args.threads, len(prompt) + args.new_tokens + 8)
    if llm is None:
        return None
    run = lambda: bench_llama_cpp(llm, prompt, args.new_tokens)  # noqa: E731
    run()
    result = best([run() for _ in range(args.repeat)])
    llm.close()
    return result


def wheel_row(path: Path, args: argparse.Namespace, prompt: list[int]) -> Result | str:
    """llama-cpp-python's own library, in a child process without LLAMA_CPP_LIB_PATH (a
    process loads one llama.cpp); a reason string when it cannot run."""
    spec = find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return "llama-cpp-python is not installed"
    lib = Path(spec.origin).parent / "lib"
    if not any(lib.glob("libllama.*")):
        return f"the wheel has no library of its own ({lib}: installed with LLAMA_BUILD=OFF)"
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_CPP_LIB_PATH"}
    cmd = [sys.executable, __file__, "--wheel-child", str(path), "--threads", str(args.threads),
           "--new-tokens", str(args.new_tokens), "--repeat", str(args.repeat),
           "--prompt", ",".join(map(str, prompt))]  # fmt: skip
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
    return Result(**json.loads(out.stdout.strip().splitlines()[-1]))


def memory_line(path: Path, args: argparse.Namespace) -> str:
    r = probe(path, args.max_batch, args.max_seq)
    if isinstance(r, str):
        return f"memory probe failed: {r}"
    card = card_from_path(path)
    est = card_estimate(card, 0, card.n_layers, max_batch=args.max_batch, max_seq=args.max_seq)
    peak = r["load_peak"] / r["running"]
    return (
        f"load: running weights {r['running'] / MiB:.0f} MiB (file {r['file_bytes'] / MiB:.0f}), "
        f"load peak / running size {peak:.2f} (target <= 1.2); estimate {est.total / MiB:.0f} "
        f"MiB / RSS {r['full'] / MiB:.0f} MiB = {est.total / r['full']:.3f} (target within 10%; "
        f"KV cache {args.max_batch} x {args.max_seq})"
    )


def ratio(label: str, a: Result, c: Result) -> str:
    return (f"{label} a/c: decode {a.decode_tok_s / c.decode_tok_s:.2f}x, "
            f"prefill {a.prefill_tok_s / c.prefill_tok_s:.2f}x")  # fmt: skip


def bench_file(path: Path, args: argparse.Namespace) -> list[str]:
    print(f"model {path.name} ({path.stat().st_size / MiB:.0f} MiB), threads {args.threads}, "
          f"{args.new_tokens} new tokens, best of {args.repeat}", flush=True)  # fmt: skip
    print(memory_line(path, args), flush=True)
    cache = Path(tempfile.gettempdir()) / "exo-bench-cache"
    prompt = _prompt(path, args.threads, cache)
    rows: list[tuple[str, Result]] = [("ours", ours(path, args, prompt, cache))]
    native = os.environ.get("LLAMA_CPP_LIB_PATH")
    if native:
        result = llama_cpp(path, args, prompt)
        if result is not None:
            rows.append(("native", result))
    else:
        print("(c) native llama.cpp build: skipped (set LLAMA_CPP_LIB_PATH to its lib folder)")
    wheel = wheel_row(path, args, prompt)
    if isinstance(wheel, str):
        print(f"(c') llama-cpp-python's wheel build: skipped: {wheel}")
    else:
        rows.append(("wheel", wheel))
    print(f"prompt: {len(prompt)} tokens")
    print(f"{'engine':40s} {'decode tok/s':>13s} {'prefill tok/s':>14s} {'decode cpu':>11s}")
    for build, r in rows:
        name = r.name if build == "ours" else f"{r.name} [{build}]"
        print(f"{name:40s} {r.decode_tok_s:13.2f} {r.prefill_tok_s:14.1f} "
              f"{r.cpu_decode_tok_s:11.2f}")  # fmt: skip
    lines = [ratio(f"{path.stem} {build}:", rows[0][1], r) for build, r in rows[1:]]
    for line in lines:
        print(line, flush=True)
    return lines


def wheel_child(args: argparse.Namespace) -> None:
    """--wheel-child: the llama.cpp row with the wheel's library, as one JSON line."""
    prompt = [int(t) for t in args.prompt.split(",")]
    result = llama_cpp(Path(args.wheel_child), args, prompt)
    if result is None:
        sys.exit("llama-cpp-python could not be imported")
    print(json.dumps(asdict(result)))


def main() -> None:
    ap = argparse.ArgumentParser(description="MoE benchmark against llama.cpp")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--files", default=",".join(QUANTS), help="families, comma-separated")
    ap.add_argument("--layers", type=int, default=None, help="blocks per file (default: each "
                    "shape's: 8 qwen3moe, 4 gpt-oss, 3 deepseek2)")  # fmt: skip
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--max-batch", type=int, default=1)
    ap.add_argument("--max-seq", type=int, default=4096)
    ap.add_argument("--wheel-child", help=argparse.SUPPRESS)
    ap.add_argument("--prompt", help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    # the memory probe's child process runs these sources too (not an installed copy)
    src = str(Path(__file__).resolve().parents[1] / "src")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
    if args.wheel_child:
        wheel_child(args)
        return
    archs = [a for a in args.files.split(",") if a]
    unknown = [a for a in archs if a not in QUANTS]
    if unknown:
        sys.exit(f"moe.py: unknown --files {', '.join(unknown)} (choose from {', '.join(QUANTS)})")
    summary: list[str] = []
    for arch in archs:
        with tempfile.TemporaryDirectory() as tmp:  # one file on disk at a time
            t0 = time.perf_counter()
            path = generate(Request(arch, "real-layer", QUANTS[arch], Path(tmp), args.layers))
            print(f"\n== generated {path.name} in {time.perf_counter() - t0:.0f} s", flush=True)
            summary += bench_file(path, args)
    print("\nsummary (same run):")
    for line in summary:
        print(f"  {line}")


if __name__ == "__main__":
    main()
