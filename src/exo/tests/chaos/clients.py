"""Clients for the chaos suite and the soak benchmark: one request in one of the four
API formats (OpenAI chat, OpenAI responses, Claude messages, Ollama chat), streaming or
not, maybe cancelled early, classified by how it ended."""

import json
import random
import time
from dataclasses import dataclass
from typing import Any, Literal

import httpx

Kind = Literal["openai_chat", "openai_responses", "claude", "ollama"]
KINDS: tuple[Kind, ...] = ("openai_chat", "openai_responses", "claude", "ollama")
Ending = Literal["answer", "error", "cancelled", "cut", "hung"]


@dataclass(frozen=True)
class Outcome:
    kind: Kind
    stream: bool
    ending: Ending
    status: int
    seconds: float
    detail: str = ""


def _request(kind: Kind, model: str, prompt: str, stream: bool, max_tokens: int) -> tuple[str, dict[str, Any]]:
    messages = [{"role": "user", "content": prompt}]
    match kind:
        case "openai_chat":
            return "/v1/chat/completions", {"model": model, "messages": messages,
                                            "stream": stream, "max_tokens": max_tokens}
        case "openai_responses":
            return "/v1/responses", {"model": model, "input": prompt, "stream": stream,
                                     "max_output_tokens": max_tokens}
        case "claude":
            return "/v1/messages", {"model": model, "messages": messages, "stream": stream,
                                    "max_tokens": max_tokens}
        case "ollama":
            return "/api/chat", {"model": model, "messages": messages, "stream": stream,
                                 "options": {"num_predict": max_tokens}}


def _stream_error(line: str) -> str | None:
    """The error a streamed line carries, in any of the four formats (None: none)."""
    text = line.removeprefix("data:").strip()
    if not text.startswith("{"):
        return "error" if line.startswith("event: error") else None
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(body, dict):
        return None
    if "error" in body:
        return str(body["error"])  # pyright: ignore[reportUnknownArgumentType]
    if body.get("type") in ("error", "response.failed"):  # pyright: ignore[reportUnknownMemberType]
        return text
    return None


def run_one(
    url: str, kind: Kind, model: str, *, stream: bool, cancel_after: int | None = None,
    deadline_s: float = 60.0, max_tokens: int = 12, prompt: str = "Say hello.",
    extra: dict[str, Any] | None = None,
) -> Outcome:
    """One request; ``cancel_after``: close a stream after that many lines; ``extra``:
    more fields of the request's body."""
    path, body = _request(kind, model, prompt, stream, max_tokens)
    body = {**body, **(extra or {})}
    started = time.monotonic()

    def done(ending: Ending, status: int, detail: str = "") -> Outcome:
        return Outcome(kind, stream, ending, status, time.monotonic() - started, detail[:300])

    try:
        with httpx.Client(timeout=httpx.Timeout(deadline_s, connect=5)) as client:
            if not stream:
                r = client.post(url + path, json=body)
                if r.status_code == 200:
                    return done("answer", 200)
                try:
                    r.json()
                except ValueError:
                    return done("cut", r.status_code, f"not JSON: {r.text[:200]}")
                return done("error", r.status_code, r.text)
            with client.stream("POST", url + path, json=body) as r:
                if r.status_code != 200:
                    r.read()
                    return done("error", r.status_code, r.text)
                lines = 0
                error: str | None = None
                for line in r.iter_lines():
                    if time.monotonic() - started > deadline_s:
                        return done("hung", 200, "stream past its deadline")
                    if not line:
                        continue
                    lines += 1
                    error = error or _stream_error(line)
                    if cancel_after is not None and lines >= cancel_after:
                        return done("cancelled", 200)
                return done("error" if error else "answer", 200, error or "")
    except httpx.TimeoutException as e:
        return done("hung", 0, repr(e))
    except httpx.HTTPError as e:
        return done("cut", 0, repr(e))


def random_request(
    rng: random.Random, url: str, model: str, deadline_s: float = 60.0
) -> Outcome:
    kind = rng.choice(KINDS)
    stream = rng.random() < 0.5
    cancel_after = rng.randint(1, 3) if stream and rng.random() < 0.25 else None
    return run_one(url, kind, model, stream=stream, cancel_after=cancel_after,
                   deadline_s=deadline_s, max_tokens=rng.randint(4, 16))
