"""Speed of the quantised linear kernel (`exo_qlinear`) per layer shape and number of rows.

    python bench/kernels.py [--threads 1] [--rows 1 2 4 8 60] [--cold] [--model smollm2 gemma3]

Each row of the table is one layer of SmolLM2-135M (Q4_1, its head Q8_0; "g8": the same layer
re-laid in groups of 8 rows, as the engine runs Q4_1 and Q8_0 on AVX2) or of Gemma 3 270M's
Q4_K_M file (its layouts: q | k | v and gate | up Q5_0, o Q4_K, down Q6_K) or of a
Llama-3.2-1B-shaped Q4_K_M file (`llama1b`, with its gate | up also in Q4_0 and Q4_1; `llama1b_q5`:
the same shape in Q5_K, and its gate | up in Q5_0 and Q5_1), with random weights
of that layout, called through the checked wrapper an engine uses (`QKernels.linear`). A column
per number of activation rows: 1 is a decode step of one stream, 8 a step of 8 streams batched,
60 a prefill. A layout with 8-bit-activation dots (`Kind.act8`) gets rows "x8" and "g8 x8" more: its
file rows and its groups against activations quantised to int8 blocks (EXO_ACTIVATIONS=8; the
other rows: 16-bit). Figures are microseconds per call of the process's CPU time (the machine may be
shared: wall-clock figures move with its load, CPU time does not; at more threads CPU time is a
measure of cost, not of speed), best of `--repeat` rounds. `--cold` cycles through copies of the
weights larger than the last-level cache, as a whole model's weights are in a real step.
"""

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from exo.worker.engines.cpu_kernels import (
    GROUPED,
    KIND_Q4,
    KIND_Q4_K,
    KIND_Q5_0,
    KIND_Q5_1,
    KIND_Q5_K,
    KIND_Q6_K,
    KIND_Q8,
    PROLOGUE_NONE,
    PROLOGUE_RMS_NORM,
    PROLOGUE_SWIGLU,
    QKernels,
    QuantWeights,
    load_kernels,
)
from exo.worker.engines.kinds import BY_KERNEL, kind_named

KIND_Q4_0 = kind_named("Q4_0").kernel

BLOCK = {KIND_Q4_0: (18, 32), KIND_Q4: (20, 32), KIND_Q8: (34, 32), KIND_Q5_0: (22, 32), KIND_Q4_K: (144, 256),
         KIND_Q6_K: (210, 256), KIND_Q5_1: (24, 32), KIND_Q5_K: (176, 256)}  # fmt: skip
# (offset, f16 scale) fields per layout: set to sane values, the rest of each block is random
SCALES = {KIND_Q4_0: (0,), KIND_Q4: (0, 2), KIND_Q8: (0,), KIND_Q5_0: (0,), KIND_Q4_K: (0, 2), KIND_Q6_K: (208,),
          KIND_Q5_1: (0, 2), KIND_Q5_K: (0, 2)}  # fmt: skip
NAMES = {KIND_Q4_0: "Q4_0", KIND_Q4: "Q4_1", KIND_Q8: "Q8_0", KIND_Q5_0: "Q5_0", KIND_Q4_K: "Q4_K", KIND_Q6_K: "Q6_K",
         KIND_Q5_1: "Q5_1", KIND_Q5_K: "Q5_K"}  # fmt: skip
# name, layout, prologue, k, n
MODELS = {
    "smollm2": [
        ("qkv", KIND_Q4, PROLOGUE_RMS_NORM, 576, 960),
        ("o", KIND_Q4, PROLOGUE_NONE, 576, 576),
        ("gate_up", KIND_Q4, PROLOGUE_RMS_NORM, 576, 3072),
        ("down", KIND_Q4, PROLOGUE_SWIGLU, 1536, 576),
        ("head", KIND_Q8, PROLOGUE_RMS_NORM, 576, 49152),
    ],
    "gemma3": [
        ("qkv", KIND_Q5_0, PROLOGUE_RMS_NORM, 640, 1536),
        ("o", KIND_Q4_K, PROLOGUE_NONE, 1024, 640),
        ("gate_up", KIND_Q5_0, PROLOGUE_RMS_NORM, 640, 4096),
        ("down", KIND_Q6_K, PROLOGUE_SWIGLU, 2048, 640),
    ],
    # a Llama-3.2-1B-shaped Q4_K_M layer (width 2048, ffn 8192, 32 / 8 heads of 64), and its
    # gate | up in Q4_0 and Q4_1 (a Q4_0 file ran as Q4_1 before Q4_0 had kernels of its own)
    "llama1b": [
        ("qkv", KIND_Q4_K, PROLOGUE_RMS_NORM, 2048, 3072),
        ("o", KIND_Q4_K, PROLOGUE_NONE, 2048, 2048),
        ("gate_up", KIND_Q4_K, PROLOGUE_RMS_NORM, 2048, 16384),
        ("down", KIND_Q6_K, PROLOGUE_SWIGLU, 8192, 2048),
        ("gate_up", KIND_Q4_0, PROLOGUE_RMS_NORM, 2048, 16384),
        ("gate_up", KIND_Q4, PROLOGUE_RMS_NORM, 2048, 16384),
    ],
    # the 1B shape's three matrix sizes in Q4_0 (the 8-bit activations' kinds, issue 22)
    "llama1b_q4_0": [
        ("o", KIND_Q4_0, PROLOGUE_NONE, 2048, 2048),
        ("up", KIND_Q4_0, PROLOGUE_RMS_NORM, 2048, 8192),
        ("down", KIND_Q4_0, PROLOGUE_SWIGLU, 8192, 2048),
    ],
    # issue 22 q5dots: a Llama-3.2-1B-shaped Q5_K_M layer (its down in Q5_K here), and its gate | up
    # in Q5_0 and Q5_1 (Q5_K_M's fallback for rows that do not fill 256-value blocks)
    "llama1b_q5": [
        ("qkv", KIND_Q5_K, PROLOGUE_RMS_NORM, 2048, 3072),
        ("o", KIND_Q5_K, PROLOGUE_NONE, 2048, 2048),
        ("gate_up", KIND_Q5_K, PROLOGUE_RMS_NORM, 2048, 16384),
        ("down", KIND_Q5_K, PROLOGUE_SWIGLU, 8192, 2048),
        ("gate_up", KIND_Q5_0, PROLOGUE_RMS_NORM, 2048, 16384),
        ("gate_up", KIND_Q5_1, PROLOGUE_RMS_NORM, 2048, 16384),
    ],
}
LAST_LEVEL_CACHE = 64 << 20  # bytes of weights cycled through with --cold: above any L3 here


def random_weights(kind: int, n: int, k: int, rng: np.random.Generator) -> torch.Tensor:
    size, per = BLOCK[kind]
    blocks = rng.integers(0, 256, size=(n * k // per, size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
    for off in SCALES[kind]:
        blocks[:, off : off + 2] = scale
    return torch.from_numpy(blocks.reshape(n, -1))


def time_layer(
    kernels: QKernels,
    layer: tuple[str, int, int, int, int],
    rows: int,
    cold: bool,
    repeat: int,
    grouped: bool = False,
) -> float:
    _, kind, prologue, k, n = layer
    rng = np.random.default_rng(0)
    first = random_weights(kind, n, k, rng)
    if grouped:
        kernels.repack_rows(kind, first, first)
    copies = max(1, LAST_LEVEL_CACHE // first.numel() + 1) if cold else 1
    gain = torch.rand(k) + 0.5
    part_kinds = [GROUPED[kind]] if grouped else None
    weights = [
        QuantWeights(
            kind, prologue, [first if i == 0 else first.clone()], gain, 1e-5, None, k, part_kinds
        )
        for i in range(copies)
    ]
    width = 2 * k if prologue == PROLOGUE_SWIGLU else k
    x = torch.randn(rows, width)
    calls = max(copies, int(2e8 // (rows * n * k) + 3))
    best = float("inf")
    for _ in range(repeat):
        t = time.process_time()
        for i in range(calls):
            kernels.linear(weights[i % copies], x)
        best = min(best, (time.process_time() - t) / calls)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 60])
    parser.add_argument("--model", nargs="+", choices=sorted(MODELS), default=sorted(MODELS))
    parser.add_argument("--cold", action="store_true", help="weights not in cache")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    kernels = load_kernels()
    if kernels is None:
        sys.exit("the CPU kernels did not build here (see the log): nothing to measure")
    kernels.set_threads(args.threads)
    print(f"exo_qlinear, the {kernels.isa} build (EXO_KERNEL_ISA picks another), {args.threads} thread(s), CPU us per call"
          + (", weights not in cache" if args.cold else ""))  # fmt: skip
    print(f"{'layer':<22}" + "".join(f"{f'M={m}':>10}" for m in args.rows) + f"{'GMAC/s':>10}")
    for model in args.model:
        for layer in MODELS[model]:
            name, kind, _, k, n = layer
            layouts = [(False, 16)]
            if kind in GROUPED and kernels.x86:
                layouts.append((True, 16))
            if BY_KERNEL[kind][0].act8:
                layouts.append((False, 8))
                if kind in GROUPED and kernels.x86:
                    layouts.append((True, 8))
            for grouped, bits in layouts:
                kernels.set_activations(bits)
                times = [
                    time_layer(kernels, layer, m, args.cold, args.repeat, grouped)
                    for m in args.rows
                ]
                rate = max(m * n * k / (t * 1e3) for m, t in zip(args.rows, times, strict=True))
                suffix = (" g8" if grouped else "") + (" x8" if bits == 8 else "")
                label = f"{model} {name} {NAMES[kind]}{suffix}"
                print(f"{label:<22}" + "".join(f"{t:>10.1f}" for t in times) + f"{rate:>10.1f}")


if __name__ == "__main__":
    main()
