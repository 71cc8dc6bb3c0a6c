"""The image path's figures: the time to encode one image (processor, tower, projector) for
the tiny Gemma 3 test tower and a real-layer-shaped Gemma 3 4B tower (random weights: SigLIP
so400m, 27 layers of width 1152, 16 heads, an 896x896 image in 14-pixel patches pooled to 256
soft tokens, projected to the text width), and for the generator's tiny Qwen2.5-VL tower and a
real-layer Qwen2.5-VL-7B one (`vision_qwen.py`; one 448x448 image), best of N at each thread
count; then the time to first token of a one-image chat prompt through a real node (best of N,
a node per thread count) for the tiny `gemma3-vision` and `qwen2.5-vl` folders that
`bench/make_model.py ... --shape tiny --safetensors` writes under a temporary directory.

    python bench/vision.py [--threads 1,2] [--repeats 2] [--text-hidden 2560] [--tiny-only]
                           [--model DIR]

--model: one vision model (folder, or GGUF with its mmproj) for the node's TTFT instead of the
generated tiny ones; for a real-layer Gemma 3 4B-shaped one (its whole tower, two text layers
at 4B width, random weights): `python bench/make_model.py gemma3-vision --shape real-layer
--safetensors --out DIR` (3.3 GB). --tiny-only: no real-layer-shaped towers.
"""

import argparse
import base64
import io
import json
import subprocess
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vision_qwen import label, random_qwen25

BENCH = Path(__file__).resolve().parent
TINY_FAMILIES = ("gemma3-vision", "qwen2.5-vl")

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


def encode_times(name: str, encode: Callable[[], int], threads: list[int], repeats: int,
                 size: int) -> None:  # fmt: skip
    """`encode` encodes the one image and says into how many tokens."""
    tokens: list[int] = []
    for n in threads:
        torch.set_num_threads(n)
        seconds = best_of(repeats, lambda: tokens.append(encode()))
        print(f"encode {name}: {seconds * 1000:10.1f} ms  ({n} thread{'s' if n > 1 else ''}, "
              f"best of {repeats}; 1 {size}x{size} image -> {tokens[-1]} tokens)",
              flush=True)  # fmt: skip


def gemma_encode_times(name: str, vision: Gemma3Vision, threads: list[int], repeats: int) -> None:
    size = vision.config.tower.image_size
    image = photo(size)

    def encode() -> int:
        vision([image])
        return vision.config.tokens_per_image

    encode_times(name, encode, threads, repeats, size)


def qwen_encode_times(shape: str, threads: list[int], repeats: int) -> None:
    start = time.perf_counter()
    vision = random_qwen25(shape)
    built = time.perf_counter() - start
    if shape != "tiny":
        print(f"(built the Qwen2.5-VL {shape} tower with random weights in {built:.1f} s)")
    image = photo(448)
    encode_times(label(shape, vision), lambda: int(vision.encode([image]).embeds.shape[0]),
                 threads, repeats, 448)  # fmt: skip


def tiny_model(family: str, work: Path) -> Path:
    """`bench/make_model.py FAMILY --shape tiny --safetensors` under `work`."""
    out = work / family
    cmd = [sys.executable, str(BENCH / "make_model.py"), family, "--shape", "tiny",
           "--safetensors", "--out", str(out)]  # fmt: skip
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return out


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
    with tempfile.TemporaryDirectory(prefix="exo-bench-vision-") as tmp:
        work = Path(tmp)
        models = [given] if given is not None else [tiny_model(f, work) for f in TINY_FAMILIES]
        buf = io.BytesIO()
        Image.new("RGB", (640, 480), (200, 40, 40)).save(buf, format="PNG")
        for model in models:
            for n in threads:
                model_ttft(model, n, repeats, buf.getvalue(), work)


def model_ttft(model: Path, n: int, repeats: int, image: bytes, work: Path) -> None:
    """One node serving `model` with `n` threads: the best TTFT of `repeats` requests."""
    from exo.tests.node_process import running_node

    try:
        with running_node(work, "--model", str(model), "--threads", str(n),
                          timeout=600) as node:  # fmt: skip
            ids = [m["id"] for m in node.get("/v1/models").json()["data"]]
            served = next((i for i in ids if model.name in i), ids[0])  # not the catalogue's
            seconds = best_of(repeats, lambda: _chat_ttft(node.url, served, image))
    except (RuntimeError, AssertionError) as e:
        print(f"node TTFT ({model.name}, {n} thread(s)): the node did not answer an image ({e})")
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
    gemma_encode_times("tiny Gemma 3 tower (64 px, 2 layers)", random_vision(TINY, 64, 4),
                       threads, a.repeats)  # fmt: skip
    qwen_encode_times("tiny", threads, a.repeats)
    if not a.tiny_only:
        start = time.perf_counter()
        real = random_vision(GEMMA3_4B, a.text_hidden, 256)
        print(f"(built the 4B-shaped tower with random weights in {time.perf_counter() - start:.1f} s)")
        gemma_encode_times(f"Gemma 3 4B-shaped tower (896 px, 27 layers, -> {a.text_hidden})",
                           real, threads, a.repeats)  # fmt: skip
        del real
        qwen_encode_times("8b", threads, a.repeats)
    node_ttft(a.model, threads, a.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
