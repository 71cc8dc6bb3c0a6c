"""Loading benchmark: time, peak memory and placement's estimate, per weight format.

    python bench/load.py [--hidden 2048 --ffn 5632 --layers 16 --vocab 32000]

For a generated llama model (exo.modelgen: peaked random weights) in Q4_K_M, Q8_0 and F16 GGUF and BF16
safetensors, each loaded in a fresh process (`memory_probe`), one row per format:

* load time (seconds);
* peak resident memory during the load (anonymous: weights and heap, not library code paged in)
  minus that before it, over the running size (target <= 1.2);
* running size over the weights' bytes in the file (target <= 1.15);
* placement's estimate (`placement_memory.card_estimate`, fed from the model card that
  `card_from_path` builds for the file: weights in their running format + KV cache at its
  maximum + a runner's overhead) over the measured RSS with the KV cache grown to that
  maximum (target within 10%).

The defaults give a Q4_K_M file of about 1 GB (F16: about 3.5 GB) and a runner's real maximum
(EXO_RUNNER_MAX_BATCH requests of 2048 tokens); use small values for a smoke run, e.g.
`--layers 2 --hidden 256 --ffn 512 --vocab 1000`. At a tiny size peak/run measures the
allocator's noise, not the loader (a few MB over a weight size of 1 MB).
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from exo.master.placement_memory import card_estimate
from exo.modelgen.custom import Size, llama_gguf, llama_safetensors
from exo.shared.constants import EXO_RUNNER_MAX_BATCH
from exo.worker.download.local import card_from_path

RECIPES = ("Q4_K_M", "Q8_0", "F16", "BF16-safetensors")
MB = 2**20


def write_model(folder: Path, recipe: str, shape: Size) -> Path:
    if recipe == "BF16-safetensors":
        return llama_safetensors(folder / "hf", shape)
    return llama_gguf(folder / f"{recipe}.gguf", recipe, shape)


def probe(path: Path, max_batch: int, max_seq: int) -> dict[str, Any] | str:
    """The memory probe's report, or why it failed."""
    out = subprocess.run(
        [sys.executable, "-m", "exo.worker.engines.tests.memory_probe", str(path),
         str(max_batch), str(max_seq)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        return (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
    report: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return report


def row(recipe: str, path: Path, max_batch: int, max_seq: int) -> str:
    r = probe(path, max_batch, max_seq)
    if isinstance(r, str):
        return f"{recipe:18} failed: {r}"
    card = card_from_path(path)
    est = card_estimate(card, 0, card.n_layers, max_batch=max_batch, max_seq=max_seq)
    peak = r["load_peak"] / r["running"]
    ratio = est.total / r["full"]
    verdict = (f"peak {'ok' if peak <= 1.2 else 'MISS'}, "
               f"estimate {'ok' if abs(ratio - 1) <= 0.10 else 'MISS'}")  # fmt: skip
    return (
        f"{recipe:18} {r['file_bytes'] / MB:9.1f} {r['running'] / MB:8.1f} "
        f"{r['running'] / r['file_bytes']:8.2f} {r['seconds']:7.2f} {peak:8.2f} "
        f"{est.weights / MB:8.1f} {est.kv_cache / MB:7.1f} {est.total / MB:8.1f} "
        f"{r['full'] / MB:8.1f} {ratio:7.3f}  {verdict}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description="Loading benchmark per weight format")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=5632)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--max-batch", type=int, default=EXO_RUNNER_MAX_BATCH)
    ap.add_argument("--max-seq", type=int, default=2048)
    ap.add_argument("--recipes", nargs="*", default=list(RECIPES), choices=RECIPES)
    args = ap.parse_args()
    shape = Size(args.layers, args.hidden, args.ffn, args.heads, args.kv_heads, args.vocab)
    print(f"KV cache at {args.max_batch} x {args.max_seq} positions; targets: peak/run <= 1.2, "
          "est/RSS within 10%")  # fmt: skip
    print(f"{'format':18} {'file MB':>9} {'run MB':>8} {'run/file':>8} {'load s':>7} "
          f"{'peak/run':>8} {'est wMB':>8} {'est kv':>7} {'est MB':>8} {'RSS MB':>8} "
          f"{'est/RSS':>7}")  # fmt: skip
    for recipe in args.recipes:
        with tempfile.TemporaryDirectory() as tmp:  # one model on disk at a time
            path = write_model(Path(tmp), recipe, shape)
            print(row(recipe, path, args.max_batch, args.max_seq), flush=True)


if __name__ == "__main__":
    main()
