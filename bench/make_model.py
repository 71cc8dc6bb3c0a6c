"""Generate a random-weight model file of a registered family (exo.modelgen).

    python bench/make_model.py ARCH --shape tiny|1b|8b|real-layer [--layers N] --quant Q4_K_M \
        --out PATH [--safetensors] [--seed N]

ARCH is a family (the modules of exo.modelgen.families: dense `llama`, `qwen3`; mixtures of
experts `qwen3moe`, `gpt-oss`, `deepseek2`, `glm4moe`, whose shapes are `tiny` and
`real-layer`; vision `gemma3-vision`, `qwen2.5-vl`, `qwen3-vl`: a safetensors folder with its
processor files with `--safetensors`, or (gemma3-vision) without it a GGUF and its mmproj GGUF
into the folder --out, F32 or F16); --quant a recipe (Q4_K_M, Q5_K_M, Q4_0, Q4_1, Q5_0, Q5_1,
Q8_0, Q4_K, Q5_K, Q6_K, Q2_K, Q3_K_M, IQ4_NL, IQ4_XS, MXFP4, F16, F32, BF16: what
exo.modelgen.recipes holds; default F32 with --safetensors or for a vision family's pair;
MXFP4 on an MoE family: experts in MXFP4, the rest Q8_0, as gpt-oss ships; rows that are not
whole blocks of a K-quant take llama.cpp's fallback types). --out is
the .gguf file to write, or an existing folder to write `exo-gen-ARCH-SHAPE-QUANT.gguf` into (a
node serving `--model PATH` names the model after the file); with --safetensors, the Hugging
Face folder to create (float quants only; of the MoE families qwen3moe, glm4moe and gpt-oss,
whose experts are written as its checkpoints hold them: MXFP4 `_blocks` / `_scales`, gate and
up fused; deepseek2 is GGUF only, and says so). The weights are random, scaled so next-token
distributions are peaked; the vocabulary is SmolLM2's plus the family's special tokens.
Prints the wall time and the process's peak RSS at the end.
"""

import argparse
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from exo.modelgen import FAMILIES, RECIPES, Request, generate
from exo.modelgen.generate import validate


def parse(argv: list[str]) -> Request:
    ap = argparse.ArgumentParser(description="Generate a random-weight model (exo.modelgen)")
    ap.add_argument("arch", metavar="ARCH", help=f"model family: {', '.join(sorted(FAMILIES))}")
    ap.add_argument("--shape", required=True, help="tiny, 1b, 8b or real-layer (per family)")
    ap.add_argument("--layers", type=int, help="number of blocks (default: the shape's)")
    ap.add_argument("--quant", help=f"{', '.join(RECIPES)} (default F32 with --safetensors)")
    ap.add_argument("--out", type=Path, required=True, help=".gguf file, or folder")
    ap.add_argument("--safetensors", action="store_true", help="a Hugging Face folder instead")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    pair = a.arch in FAMILIES and FAMILIES[a.arch].mmproj_pair  # a GGUF + mmproj pair
    if a.quant is None and not a.safetensors and not pair:
        ap.error("--quant is required (it defaults to F32 only with --safetensors or for a "
                 "vision family's GGUF + mmproj pair)")
    a.quant = a.quant or "F32"
    return Request(a.arch, a.shape, a.quant, a.out, a.layers, a.safetensors, a.seed)


def _progress(name: str, done: int, total: int) -> None:
    print(f"\r{done / 2**20:9.1f} / {total / 2**20:.1f} MiB  {name:32}", end="", flush=True)


def main(argv: list[str]) -> int:
    req = parse(argv)
    try:
        validate(req)
    except ValueError as e:
        print(f"make_model: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    path = generate(req, progress=_progress if sys.stdout.isatty() else None)
    wall = time.perf_counter() - t0
    size = sum(f.stat().st_size for f in path.iterdir()) if path.is_dir() else path.stat().st_size
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(f"\nwrote {path} ({size / 2**20:.1f} MiB) in {wall:.1f} s; peak RSS {peak:.0f} MiB")
    if req.arch not in path.name:
        print(
            f"note: a node serving --model {path} calls the model {path.stem!r}; name the "
            f"file after the model (e.g. {req.arch} in it) to see the family in the model id"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
