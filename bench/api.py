"""Engine called directly vs the same engine behind a real node's HTTP API (streaming),
aggregate throughput with 8 concurrent streams, and constrained decoding (a JSON schema)
against free decoding, per token, in the same run. Prints its figures.

    python bench/api.py [--tokens 128] [--threads 1] [--only-constrained | --only-turns]
"""

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import torch

from exo.shared.models.embedded import EMBEDDED_MODEL_ID
from exo.tests.node_process import running_node
from exo.worker.download.embedded import find_embedded_gguf
from exo.worker.engines.engine import load_engine
from exo.worker.engines.sampling import SamplingParams

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def direct(tokens: int, threads: int, cache: Path) -> dict[str, float]:
    path = find_embedded_gguf()
    assert path is not None, "the embedded model is not installed"
    engine = load_engine(path, threads=threads, cache_dir=cache)
    prompt_ids = engine.tokenizer.encode(engine.tokenizer.render_chat([{"role": "user", "content": PROMPT}]))
    engine.warmup()
    gen = engine.batch_generator(1, 2048)
    params = SamplingParams(temperature=0.0, max_tokens=tokens)
    start = time.perf_counter()
    gen.add("bench", prompt_ids, params)
    first = None
    n = 0
    with torch.inference_mode():
        while gen.active:
            for _out in gen.step():
                n += 1
                if first is None:
                    first = time.perf_counter()
    end = time.perf_counter()
    assert first is not None
    return {"ttft_s": first - start, "prefill_tps": len(prompt_ids) / (first - start),
            "decode_tps": (n - 1) / (end - first), "tokens": n}


# A schema that lets the model write at length: the story is one long string.
STORY_SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string", "maxLength": 40}, "story": {"type": "string"}},
    "required": ["title", "story"],
    "additionalProperties": False,
}


@dataclass
class Streamed:
    """One streamed chat answer: when it started, its first text came and it ended."""

    start: float
    first: float
    end: float
    text: str
    prompt_tokens: int
    completion_tokens: int


def stream_chat(url: str, messages: list[dict[str, str]], tokens: int,
                extra: dict[str, object] | None = None) -> Streamed:
    body = {"model": EMBEDDED_MODEL_ID, "messages": messages, "temperature": 0,
            "max_tokens": tokens, "stream": True, "stream_options": {"include_usage": True},
            **(extra or {})}
    start = time.perf_counter()
    first = None
    parts: list[str] = []
    usage = {"prompt_tokens": 0, "completion_tokens": 0}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            usage = data.get("usage") or usage
            delta = data["choices"][0]["delta"] if data.get("choices") else {}
            if delta.get("content"):
                first = first or time.perf_counter()
                parts.append(delta["content"])
    assert first is not None
    return Streamed(start, first, time.perf_counter(), "".join(parts),
                    usage["prompt_tokens"], usage["completion_tokens"])


def stream_once(url: str, tokens: int, results: list[dict[str, float]] | None = None,
                extra: dict[str, object] | None = None) -> dict[str, float]:
    s = stream_chat(url, [{"role": "user", "content": PROMPT}], tokens, extra)
    n = s.completion_tokens
    result = {"ttft_s": s.first - s.start, "prefill_tps": s.prompt_tokens / (s.first - s.start),
              "decode_tps": (n - 1) / (s.end - s.first), "tokens": n, "wall_s": s.end - s.start}
    if results is not None:
        results.append(result)
    return result


def constrained_vs_free(url: str, tokens: int, rounds: int = 3) -> None:
    """Per-token decode time with a JSON schema against without, alternating requests."""
    schema: dict[str, object] = {"response_format": {"type": "json_schema",
                                  "json_schema": {"name": "story", "schema": STORY_SCHEMA}}}
    stream_once(url, 8, extra=schema)  # first constrained request: grammar tokenizer, caches
    free: list[float] = []
    constrained: list[float] = []
    for _ in range(rounds):
        f = stream_once(url, tokens)
        c = stream_once(url, tokens, extra=schema)
        free.append(1 / f["decode_tps"])
        constrained.append(1 / c["decode_tps"])
    f_ms, c_ms = statistics.median(free) * 1000, statistics.median(constrained) * 1000
    print(f"constrained (JSON schema) vs free decoding: {c_ms:.1f} vs {f_ms:.1f} ms/token, "
          f"ratio {c_ms / f_ms:.3f}  (target <= 1.15; median of {rounds} alternating pairs)")


LONG_TURN = " ".join(f"Fact {i}: the lighthouse at cape {i} was lit in the year {1800 + i}." for i in range(64))


def second_turn(url: str) -> None:
    """A ~1,500-token first turn, then its next turn: the prefix cache's TTFT ratio."""
    first = [{"role": "user", "content": LONG_TURN + " Which cape was lit first?"}]
    a = stream_chat(url, first, 16)
    second = [*first, {"role": "assistant", "content": a.text},
              {"role": "user", "content": "And which one last?"}]
    b = stream_chat(url, second, 16)
    t1, t2 = a.first - a.start, b.first - b.start
    print(f"conversation: first turn {a.prompt_tokens} tokens TTFT {t1 * 1000:.0f} ms; second "
          f"turn {b.prompt_tokens} tokens TTFT {t2 * 1000:.0f} ms; ratio {t2 / t1:.2f}  "
          "(target <= 0.25)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only-constrained", action="store_true",
                    help="only the constrained vs free decoding comparison")
    ap.add_argument("--only-turns", action="store_true",
                    help="only the second-turn TTFT of a long conversation (prefix cache)")
    args = ap.parse_args()
    if args.only_turns:
        with tempfile.TemporaryDirectory() as tmp, \
                running_node(Path(tmp), "--threads", str(args.threads)) as node:
            stream_once(node.url, 8)  # first request: connection, caches
            second_turn(node.url)
        return
    if args.only_constrained:
        with tempfile.TemporaryDirectory() as tmp, \
                running_node(Path(tmp), "--threads", str(args.threads)) as node:
            constrained_vs_free(node.url, args.tokens)
        return
    with tempfile.TemporaryDirectory() as tmp:
        a = direct(args.tokens, args.threads, Path(tmp) / "cache")
        print(f"(a) engine direct : decode {a['decode_tps']:.1f} tok/s, prefill {a['prefill_tps']:.0f} tok/s, "
              f"TTFT {a['ttft_s'] * 1000:.0f} ms ({a['tokens']:.0f} tokens)")
        with running_node(Path(tmp), "--threads", str(args.threads)) as node:
            stream_once(node.url, 8)  # first request: connection, caches
            b = stream_once(node.url, args.tokens)
            print(f"(b) HTTP streaming: decode {b['decode_tps']:.1f} tok/s, prefill {b['prefill_tps']:.0f} tok/s, "
                  f"TTFT {b['ttft_s'] * 1000:.0f} ms ({b['tokens']:.0f} tokens)")
            print(f"    (b)/(a) decode = {b['decode_tps'] / a['decode_tps']:.3f}  (target >= 0.95)")
            results: list[dict[str, float]] = []
            threads = [threading.Thread(target=stream_once, args=(node.url, args.tokens, results))
                       for _ in range(8)]
            start = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - start
            total = sum(r["tokens"] for r in results)
            aggregate = total / wall
            print(f"8 concurrent streams: aggregate {aggregate:.1f} tok/s over {wall:.1f} s; "
                  f"TTFT median {statistics.median(r['ttft_s'] for r in results) * 1000:.0f} ms, "
                  f"max {max(r['ttft_s'] for r in results) * 1000:.0f} ms")
            print(f"    aggregate / one stream = {aggregate / b['decode_tps']:.2f}  (target >= 3)")
            constrained_vs_free(node.url, args.tokens)
            second_turn(node.url)


if __name__ == "__main__":
    sys.exit(main())
