"""Loading benchmark: time, peak memory and the placement estimate, per weight format.

    python bench/load.py [--hidden 2048 --ffn 5632 --layers 16 --vocab 32000]

For a generated llama model (random valid weights) in Q4_K_M, Q8_0 and F16 GGUF and BF16
safetensors, each loaded in a fresh process (`memory_probe`): load time, peak RSS during the
load over the running size (target <= 1.2), running size over file bytes (target <= 1.15),
and `estimate_runner_memory` over the measured RSS with the KV cache at its maximum (target
within 10%). The defaults give a Q4_K_M file of about 1 GB (F16: about 3.5 GB); use small
values for a smoke run.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from exo.shared.models.memory import estimate_runner_memory
from exo.worker.engines.tests.generated import write_gguf, write_safetensors

RECIPES = ("Q4_K_M", "Q8_0", "F16", "BF16-safetensors")


def main() -> None:
    ap = argparse.ArgumentParser(description="Loading benchmark per weight format")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=5632)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--max-batch", type=int, default=4)
    ap.add_argument("--max-seq", type=int, default=2048)
    ap.add_argument("--recipes", nargs="*", default=list(RECIPES))
    args = ap.parse_args()
    shape = {
        "layers": args.layers, "hidden": args.hidden, "ffn": args.ffn, "heads": args.heads,
        "kv_heads": args.kv_heads, "vocab": args.vocab,
    }  # fmt: skip
    print(f"{'format':18} {'file MB':>9} {'run MB':>8} {'run/file':>8} {'load s':>7} "
          f"{'peak/run':>8} {'est MB':>8} {'RSS MB':>8} {'est/RSS':>7}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for recipe in args.recipes:
            if recipe == "BF16-safetensors":
                path = write_safetensors(Path(tmp) / "hf", **shape)
            else:
                path = write_gguf(Path(tmp) / f"{recipe}.gguf", recipe, **shape)
            out = subprocess.run(
                [sys.executable, "-m", "exo.worker.engines.tests.memory_probe", str(path),
                 str(args.max_batch), str(args.max_seq)],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            r = json.loads(out.stdout.strip().splitlines()[-1])
            est = estimate_runner_memory(
                weight_file_bytes=r["file_bytes"], file_format=r["file_format"],
                n_layers=r["n_layers"], kv_heads=r["kv_heads"], head_dim=r["head_dim"],
                max_seq=args.max_seq, max_batch=args.max_batch, kernels=r["kernels"],
            )  # fmt: skip
            mb = 2**20
            print(
                f"{recipe:18} {r['file_bytes'] / mb:9.1f} {r['running'] / mb:8.1f} "
                f"{r['running'] / r['file_bytes']:8.2f} {r['seconds']:7.2f} "
                f"{(r['peak'] - r['baseline']) / r['running']:8.2f} {est.total / mb:8.1f} "
                f"{r['full'] / mb:8.1f} {est.total / r['full']:7.3f}",
                flush=True,
            )
            for p in Path(tmp).iterdir():
                if p.is_file():
                    p.unlink()


if __name__ == "__main__":
    main()
