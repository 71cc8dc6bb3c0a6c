"""Gemma 3's image path: the time to encode one image (processor, SigLIP tower, projector) for
the tiny test tower and a real-layer-shaped Gemma 3 4B tower (random weights: SigLIP so400m,
27 layers of width 1152, 16 heads, an 896x896 image in 14-pixel patches pooled to 256 soft
tokens, projected to the text width), best of N at each thread count; then the time to first
token of a one-image chat prompt through a real node, where the engine takes images (else one
line saying why it was skipped). Prints its figures.

    python bench/vision.py [--threads 1,2] [--repeats 2] [--text-hidden 2560] [--tiny-only]
                           [--model DIR]

--model: a Gemma 3 vision model folder (or GGUF with its mmproj) for the node's TTFT; without
it the tiny model that `bench/make_model.py gemma3-vision` writes, when that family exists.
"""

import argparse
import base64
import io
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import httpx
import torch
from PIL import Image

from exo.api.images import decode_image
from exo.shared.types.text_generation import InputImage
from exo.worker.engines.models.gemma3_mmproj import gguf_to_hf_names
from exo.worker.engines.models.gemma3_vision import Gemma3Vision, Gemma3VisionConfig
from exo.worker.engines.models.siglip import SiglipConfig

TINY = SiglipConfig(hidden=32, intermediate=64, layers=2, heads=2, image_size=64, patch_size=16)
GEMMA3_4B = SiglipConfig(hidden=1152, intermediate=4304, layers=27, heads=16, image_size=896,
                         patch_size=14)  # fmt: skip


def _shape(name: str, c: SiglipConfig, text_hidden: int) -> tuple[int, ...]:
    d, i = c.hidden, c.intermediate
    if name.endswith("patch_embedding.weight"):
        return (d, c.channels, c.patch_size, c.patch_size)
    if name.endswith("position_embedding.weight"):
        return (c.patches_per_side**2, d)
    if name.endswith("mm_input_projection_weight"):
        return (d, text_hidden)
    if ".mlp.fc1." in name:
        return (i, d) if name.endswith("weight") else (i,)
    if ".mlp.fc2." in name:
        return (d, i) if name.endswith("weight") else (d,)
    if "_proj.weight" in name:
        return (d, d)
    return (d,)  # norms and biases


def random_vision(c: SiglipConfig, text_hidden: int, tokens: int, seed: int = 0) -> Gemma3Vision:
    """A Gemma 3 tower and projector of this shape with random weights (std 0.02, norms ~1)."""
    g = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for name in gguf_to_hf_names(c.layers).values():
        t = torch.randn(_shape(name, c, text_hidden), generator=g) * 0.02
        if "norm" in name and name.endswith("weight"):
            t += 1.0
        tensors[name] = t
    config = Gemma3VisionConfig(tower=c, text_hidden=text_hidden, tokens_per_image=tokens,
                                image_token=262144)  # fmt: skip
    return Gemma3Vision(config, tensors)


def photo(size: int, seed: int = 0) -> InputImage:
    """A PNG of random pixels, ``size`` x ``size`` (the tower's own square: no resize cost)."""
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (size, size, 3), generator=g, dtype=torch.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels.numpy()).save(out, format="PNG")
    return decode_image(out.getvalue())


def best_of(repeats: int, fn: Callable[[], object]) -> float:
    times: list[float] = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def encode_times(name: str, vision: Gemma3Vision, threads: list[int], repeats: int) -> None:
    image = photo(vision.config.tower.image_size)
    for n in threads:
        torch.set_num_threads(n)
        seconds = best_of(repeats, lambda: vision([image]))
        out = vision.config.tokens_per_image
        print(f"encode {name}: {seconds * 1000:10.1f} ms  ({n} thread{'s' if n > 1 else ''}, "
              f"best of {repeats}; 1 image -> {out} soft tokens)", flush=True)  # fmt: skip


def _vision_model(given: Path | None, work: Path) -> Path | str:
    """The model the node serves, or why there is none."""
    if given is not None:
        return given
    from exo.modelgen import FAMILIES

    if "gemma3-vision" not in FAMILIES:
        return ("no Gemma 3 vision model to serve: give --model DIR (bench/make_model.py has no "
                "gemma3-vision family on this branch)")  # fmt: skip
    from exo.modelgen import Request, generate

    return generate(Request("gemma3-vision", "tiny", "F32", work / "gemma3-vision", None, True, 0))


def _chat_ttft(url: str, model: str, image: bytes) -> float:
    """Seconds to the first streamed token of a one-image chat request (RuntimeError: refused)."""
    data = "data:image/png;base64," + base64.b64encode(image).decode()
    body = {"model": model, "stream": True, "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "What is in this picture?"},
                {"type": "image_url", "image_url": {"url": data}}]}]}  # fmt: skip
    start = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.read().decode()[:300]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("error"):
                raise RuntimeError(str(chunk["error"])[:300])
            if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                return time.perf_counter() - start
    raise RuntimeError("the stream ended without a token")


def node_ttft(given: Path | None, threads: list[int], repeats: int) -> None:
    from exo.tests.node_process import running_node

    with tempfile.TemporaryDirectory(prefix="exo-bench-vision-") as tmp:
        work = Path(tmp)
        model = _vision_model(given, work)
        if isinstance(model, str):
            print(f"skip node TTFT: {model}")
            return
        buf = io.BytesIO()
        Image.new("RGB", (640, 480), (200, 40, 40)).save(buf, format="PNG")
        for n in threads:
            try:
                with running_node(work, "--model", str(model), "--threads", str(n),
                                  timeout=600) as node:  # fmt: skip
                    served = node.get("/v1/models").json()["data"][0]["id"]
                    seconds = best_of(
                        repeats, lambda url=node.url, m=served: _chat_ttft(url, m, buf.getvalue())
                    )
            except (RuntimeError, AssertionError) as e:
                print(f"skip node TTFT: the node did not answer an image ({e})")
                return
            print(f"node TTFT, 1-image chat prompt ({model.name}): {seconds * 1000:10.1f} ms  "
                  f"({n} thread{'s' if n > 1 else ''}, best of {repeats})", flush=True)  # fmt: skip


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--threads", default="1,2", help="thread counts, comma separated")
    ap.add_argument("--repeats", type=int, default=2, help="best of this many")
    ap.add_argument("--text-hidden", type=int, default=2560,
                    help="the projector's output width (Gemma 3 4B: 2560)")  # fmt: skip
    ap.add_argument("--tiny-only", action="store_true", help="skip the 4B-shaped tower")
    ap.add_argument("--model", type=Path, help="a Gemma 3 vision model for the node's TTFT")
    a = ap.parse_args(argv)
    threads = [int(t) for t in a.threads.split(",") if t]
    encode_times("tiny Gemma 3 tower (64 px, 2 layers)", random_vision(TINY, 64, 4), threads,
                 a.repeats)  # fmt: skip
    if not a.tiny_only:
        start = time.perf_counter()
        real = random_vision(GEMMA3_4B, a.text_hidden, 256)
        print(f"(built the 4B-shaped tower with random weights in {time.perf_counter() - start:.1f} s)")
        encode_times(f"Gemma 3 4B-shaped tower (896 px, 27 layers, -> {a.text_hidden})", real,
                     threads, a.repeats)  # fmt: skip
        del real
    node_ttft(a.model, threads, a.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
