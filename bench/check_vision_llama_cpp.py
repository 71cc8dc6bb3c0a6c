"""Hand the generator's Qwen VL GGUF + mmproj pairs to the native llama.cpp: does
`llama-server --mmproj` load them, and does it answer an image prompt with the greedy tokens
our engine decodes from the same pair?

    python bench/check_vision_llama_cpp.py [--archs qwen2.5-vl,qwen3-vl] [--tokens 8]

A check kept outside the test suite (it needs a llama.cpp build: LLAMA_SERVER, default
~/.cache/exo-bench/llama.cpp/bin/llama-server, its libraries in ../lib). The picture's sides
are multiples of patch x merge inside the pixel limits, so neither side resizes it (llama.cpp's
resampler is not Pillow's). llama.cpp fixes Qwen2.5-VL's attention windows at 112 pixels (the
real models' size; it does not read ``clip.vision.window_size``), while the tiny shape's are
56: for that family our tower is run with llama.cpp's windows, and the script says so.
Prints, per family, the two answers and whether they agree.
"""

import argparse
import base64
import dataclasses
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from exo.api.images import decode_image
from exo.modelgen import Request, generate
from exo.shared.types.text_generation import InputImage, InputMessage
from exo.worker.engines.chat_prompt import chat_prompt
from exo.worker.engines.engine import Engine, load_engine
from exo.worker.engines.models.qwen_vl_encoder import QwenVLEncoder
from exo.worker.engines.sampling import SamplingParams

SERVER = Path.home() / ".cache/exo-bench/llama.cpp/bin/llama-server"
QUESTION = "What is in this picture?"
LLAMA_CPP_WINDOW = 112  # pixels: llama.cpp's fixed Qwen2.5-VL window


def _picture(width: int, height: int) -> tuple[bytes, InputImage]:
    im = Image.new("RGB", (width, height))
    px = im.load()
    assert px is not None
    for x in range(width):
        for y in range(height):
            px[x, y] = ((x * 7) % 256, (y * 5) % 256, (x * y) % 256)
    out = io.BytesIO()
    im.save(out, format="PNG")
    return out.getvalue(), decode_image(out.getvalue())


def _ours(engine: Engine, image: InputImage, n: int) -> str:
    vision = engine.vision
    assert isinstance(vision, QwenVLEncoder)
    messages = [InputMessage(role="user", content=QUESTION, images=[image])]
    chat = chat_prompt(messages, [], "auto", None, engine.tokenizer.meta.chat_template)
    text = vision.expand(engine.tokenizer.render_chat(chat.messages), [image])
    ids = engine.tokenizer.encode(text, add_special_tokens=False)
    gen = engine.batch_generator(1, 1024)
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    gen.add("r", ids, params, vision.encode(ids, [image]))
    out: list[int] = []
    while gen.active:
        out += [o.token_id for o in gen.step() if o.token_id is not None]
    return engine.tokenizer.decode(out)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _llama(text: Path, mmproj: Path, png: bytes, n: int) -> str:
    binary = Path(os.environ.get("LLAMA_SERVER", str(SERVER)))
    port = _free_port()
    env = {**os.environ, "LD_LIBRARY_PATH": str(binary.parent.parent / "lib")}
    cmd = [str(binary), "-m", str(text), "--mmproj", str(mmproj), "--host", "127.0.0.1",
           "--port", str(port), "-t", "1", "-c", "1024", "--no-warmup"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited: {proc.stderr.read()[-800:]!r}")  # type: ignore[union-attr]
            try:
                urllib.request.urlopen(base + "/health", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("llama-server did not become ready in 120 s") from None
                time.sleep(0.2)
        url = "data:image/png;base64," + base64.b64encode(png).decode()
        content = [{"type": "image_url", "image_url": {"url": url}},
                   {"type": "text", "text": QUESTION}]  # fmt: skip
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": n,
                "temperature": 0, "ignore_eos": True}  # fmt: skip
        req = urllib.request.Request(base + "/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})  # fmt: skip
        reply: dict[str, Any] = json.load(urllib.request.urlopen(req, timeout=300))
        return str(reply["choices"][0]["message"]["content"])
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def check(arch: str, n: int, folder: Path) -> bool:
    text = generate(Request(arch, "tiny", "F32", folder / arch))
    mmproj = text.with_name(f"mmproj-{text.name}")
    engine = load_engine(text, cache_dir=folder / "cache", weight_format="dense")
    vision = engine.vision
    assert isinstance(vision, QwenVLEncoder)
    tower = vision.vision.tower
    if tower.config.kind == "qwen2_5_vl" and tower.config.window_size != LLAMA_CPP_WINDOW:
        print(f"{arch}: our tower runs llama.cpp's {LLAMA_CPP_WINDOW}-pixel windows "
              f"(the file says {tower.config.window_size})")  # fmt: skip
        tower.config = dataclasses.replace(tower.config, window_size=LLAMA_CPP_WINDOW)
    factor = vision.vision.processing.patch_size * vision.vision.processing.merge_size
    png, image = _picture(4 * factor, 2 * factor)
    ours, theirs = _ours(engine, image, n), _llama(text, mmproj, png, n)
    print(f"{arch}: ours      {ours!r}\n{arch}: llama.cpp {theirs!r}\n"
          f"{arch}: {'AGREE' if ours == theirs else 'DIFFER'}")  # fmt: skip
    return ours == theirs


def main() -> None:
    parser = argparse.ArgumentParser(description="Qwen VL GGUF + mmproj pairs: ours vs llama.cpp")
    parser.add_argument("--archs", default="qwen2.5-vl,qwen3-vl")
    parser.add_argument("--tokens", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="exo-vision-check-") as tmp:
        results = [check(a, args.tokens, Path(tmp)) for a in args.archs.split(",")]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
