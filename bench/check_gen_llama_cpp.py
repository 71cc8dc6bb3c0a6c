"""Hand the generator's files to the native llama.cpp: does it load them, does it tokenize our
prompts as we do, and does it decode the greedy tokens our engine decodes?

    python bench/check_gen_llama_cpp.py [--archs qwen3moe,gpt-oss,deepseek2,glm4moe]
        [--shape tiny] [--quant Q8_0] [--layers N] [--tokens 16]

A check kept outside the test suite (it needs a llama.cpp build). llama.cpp is reached through
llama-cpp-python when it imports (LLAMA_CPP_LIB_PATH selects a native build's libraries), else
through `llama-server` (LLAMA_SERVER, default ~/.cache/exo-bench/llama.cpp/bin/llama-server,
as bench/build_llama_cpp.sh installs it). Each family's file is generated into a temporary
folder; the prompts are rendered by our engine with the file's chat template and handed to
llama.cpp as token ids, so only the model runs on its side. Prints, per family and prompt, the
number of leading greedy tokens on which the two agree (of --tokens), and both token lists
where they part.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from exo.modelgen import Request, generate
from exo.worker.engines.engine import Engine, load_engine
from exo.worker.engines.models.base import StepInputs
from exo.worker.engines.sampling import SamplingParams

PROMPTS = (
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):",
    "Water boils at",
    "List three colours.",
)
SERVER = Path.home() / ".cache/exo-bench/llama.cpp/bin/llama-server"
Greedy = Callable[[list[int], int, list[int]], list[int]]  # prompt ids, n, banned -> greedy ids


def _python_llama(path: Path, threads: int) -> tuple[Greedy, Callable[[str], list[int]]] | None:
    """llama-cpp-python's greedy decoding and tokenizer on `path` (None: it does not import)."""
    try:
        import llama_cpp  # type: ignore[import-not-found]
    except Exception as e:  # ImportError, or its library is missing (RuntimeError...)
        print(f"llama-cpp-python unavailable ({type(e).__name__}: {e}); using llama-server")
        return None
    llm: Any = llama_cpp.Llama(model_path=str(path), n_ctx=512, n_threads=threads, verbose=False)

    def greedy(ids: list[int], n: int, banned: list[int]) -> list[int]:
        def ban(_: Any, scores: Any) -> Any:
            scores[banned] = -float("inf")
            return scores

        llm.reset()
        llm.eval(ids)
        out: list[int] = []
        for _ in range(n):
            token = int(llm.sample(top_k=1, logits_processor=[ban]))
            out.append(token)
            llm.eval([token])
        return out

    def tokenize(text: str) -> list[int]:
        return [int(t) for t in llm.tokenize(text.encode(), add_bos=False, special=True)]

    return greedy, tokenize


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: dict[str, object]) -> dict[str, Any]:
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        answer: dict[str, Any] = json.loads(r.read())
        return answer


@contextmanager
def _server(path: Path, threads: int) -> Generator[tuple[Greedy, Callable[[str], list[int]]]]:
    """llama-server on `path` (loopback), its greedy decoding and tokenizer."""
    binary = Path(os.environ.get("LLAMA_SERVER", str(SERVER)))
    port = _free_port()
    cmd = [str(binary), "-m", str(path), "--host", "127.0.0.1", "--port", str(port),
           "-t", str(threads), "-c", "512", "-np", "1"]  # fmt: skip
    log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in the finally below)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                log.seek(0)
                tail = log.read().decode(errors="replace").strip().splitlines()[-5:]
                raise RuntimeError("llama-server exited: " + " | ".join(tail))
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("llama-server did not become ready in 300 s")
            time.sleep(0.5)

        def greedy(ids: list[int], n: int, banned: list[int]) -> list[int]:
            del banned  # (ignore_eos bans its end-of-generation tokens)
            body: dict[str, object] = {"prompt": ids, "n_predict": n, "temperature": 0.0,
                                       "top_k": 1, "cache_prompt": False, "return_tokens": True,
                                       "ignore_eos": True}  # fmt: skip
            return [int(t) for t in _post(url + "/completion", body)["tokens"]]

        def tokenize(text: str) -> list[int]:
            body: dict[str, object] = {"content": text, "add_special": False, "parse_special": True}
            return [int(t) for t in _post(url + "/tokenize", body)["tokens"]]

        yield greedy, tokenize
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def check(
    path: Path, args: argparse.Namespace, greedy: Greedy, tokenize: Callable[[str], list[int]]
) -> None:
    engine = load_engine(
        path, threads=args.threads, cache_dir=Path(tempfile.gettempdir()) / "exo-check-cache"
    )
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    agree: list[int] = []
    for text in PROMPTS:
        rendered = engine.tokenizer.render_chat([{"role": "user", "content": text}])
        ids = engine.tokenizer.encode(rendered)
        same_tokens = tokenize(rendered) == ids
        ours = list(engine.generate(ids, params))
        theirs = greedy(ids, args.tokens, list(engine.tokenizer.eos_token_ids))
        n = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
                 min(len(ours), len(theirs)))  # fmt: skip
        agree.append(n)
        print(
            f"  {text!r:28} prompt {len(ids)} tokens, tokenized alike: {same_tokens}; "
            f"greedy tokens agree: {n}/{args.tokens}"
        )
        if n < args.tokens:
            margin = _margin(engine, ids + ours[:n])
            print(f"    parting at token {n}, where our two best logits are {margin:.2f} apart "
                  f"(a near tie below ~0.5)\n    ours      {ours}\n    llama.cpp {theirs}")
    print(
        f"  => {sum(a == args.tokens for a in agree)}/{len(PROMPTS)} prompts agree on all "
        f"{args.tokens} tokens; leading agreement {agree}"
    )


def _margin(engine: Engine, ids: list[int]) -> float:
    """Our top-1 minus top-2 logit after `ids`."""
    cache = engine.model.new_cache(1, len(ids))
    with torch.inference_mode():
        logits = engine.model.forward(torch.tensor([ids]), StepInputs.single(0, 0, len(ids)), cache)
    top = logits[0].topk(2).values
    return float(top[0] - top[1])


def main() -> None:
    ap = argparse.ArgumentParser(description="generated files against the native llama.cpp")
    ap.add_argument("--archs", default="qwen3moe,gpt-oss,deepseek2,glm4moe")
    ap.add_argument("--shape", default="tiny")
    ap.add_argument("--quant", default="Q8_0")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    for arch in [a for a in args.archs.split(",") if a]:
        with tempfile.TemporaryDirectory() as tmp:
            path = generate(Request(arch, args.shape, args.quant, Path(tmp), args.layers))
            print(f"\n== {path.name}")
            try:
                python = _python_llama(path, args.threads)
                if python is not None:
                    print("  llama.cpp through llama-cpp-python: loaded")
                    check(path, args, *python)
                    continue
                with _server(path, args.threads) as (greedy, tokenize):
                    print("  llama.cpp through llama-server: loaded")
                    check(path, args, greedy, tokenize)
            except Exception as e:  # a file llama.cpp refuses is a result, not a crash
                print(f"  llama.cpp FAILED to load or run it: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
