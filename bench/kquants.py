"""Speed of the Q2_K / Q3_K kernels (issue 23) against the streaming dequantiser they replace and
against Q4_K's kernel, in bytes of weights read per second.

    python bench/kquants.py [--threads 1] [--rows 1 8] [--repeat 3] [--warm]

Shapes: a Qwen3-30B-A3B expert (gate | up 2048 -> 2 x 768, down 768 -> 2048) and a dense
4096 -> 4096 layer; random valid blocks of each type (`exo.modelgen.quants.random_blocks`). By
default the weights are cold: calls cycle through copies larger than the last-level cache, as a
model's experts are read in a real step (`--warm`: one copy). The kernels are called through
`QuantLinear` (what the engine builds for a GGUF weight); the streaming rows through
`StreamingLinear` (what ran these types before). Figures: process CPU time per call (the machine
may be shared), best of `--repeat`; GB/s = the layer's weight bytes / that time; the last
columns are each kernel's rate over the streaming path's and over Q4_K's kernel at that shape.
"""

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from gguf import GGMLQuantizationType

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from exo.modelgen.quants import random_blocks
from exo.worker.engines.cpu_kernels import load_kernels
from exo.worker.engines.linear import Linear, StreamingLinear, SwiGLU, make_linear
from exo.worker.engines.qtensor import QuantTensor

T = GGMLQuantizationType
SHAPES = {  # name: (k, n, SwiGLU prologue)
    "expert gate_up 2048->2x768": (2048, 1536, False),
    "expert down 768->2048": (768, 2048, True),
    "dense 4096->4096": (4096, 4096, False),
}
LAST_LEVEL_CACHE = 64 << 20


def layers(
    kind: str, qtype: GGMLQuantizationType, k: int, n: int, glu: bool, copies: int
) -> list[Linear]:
    kernels = load_kernels()
    out: list[Linear] = []
    for i in range(copies):
        qt = QuantTensor(qtype, torch.from_numpy(random_blocks(qtype, n, k, seed=i)), k)
        prologue = SwiGLU() if glu else None
        if kind == "stream":
            out.append(StreamingLinear(qt, None, prologue, torch.float32, torch.device("cpu")))
        else:
            out.append(
                make_linear(qt, None, "dense", prologue=prologue, kernels=kernels, regroup="no")
            )
    return out


def seconds_per_call(lins: list[Linear], x: torch.Tensor, calls: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.process_time()
        for i in range(calls):
            lins[i % len(lins)](x)
        best = min(best, (time.process_time() - t) / calls)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--warm", action="store_true", help="one copy of the weights (in cache)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    kernels = load_kernels()
    if kernels is None:
        sys.exit("the CPU kernels did not build here (see the log): nothing to measure")
    kernels.set_threads(args.threads)
    print(f"Q2_K / Q3_K kernels, the {kernels.isa} build, {args.threads} thread(s), "
          f"{'warm' if args.warm else 'cold'} weights; GB/s of weights read (CPU time)")  # fmt: skip
    for shape, (k, n, glu) in SHAPES.items():
        for m in args.rows:
            x = torch.randn(m, 2 * k if glu else k)
            rates: dict[str, float] = {}
            for label, kind, qtype in (
                ("Q4_K kernel", "kernel", T.Q4_K),
                ("Q2_K stream", "stream", T.Q2_K),
                ("Q2_K kernel", "kernel", T.Q2_K),
                ("Q3_K stream", "stream", T.Q3_K),
                ("Q3_K kernel", "kernel", T.Q3_K),
            ):
                one = (
                    QuantTensor(qtype, torch.from_numpy(random_blocks(qtype, 1, k)), k).n_bytes * n
                )
                copies = 1 if args.warm or kind == "stream" else LAST_LEVEL_CACHE // one + 1
                lins = layers(kind, qtype, k, n, glu, copies)
                calls = 3 if kind == "stream" else max(copies, int(4e8 // one) + 3)
                s = seconds_per_call(lins, x, calls, args.repeat)
                rates[label] = one / s / 1e9
                print(
                    f"{shape:<28} M={m:<3} {label:<12} {s * 1e6:>10.1f} us {rates[label]:>7.2f} GB/s"
                )
            for q in ("Q2_K", "Q3_K"):
                kr = rates[f"{q} kernel"]
                print(f"{shape:<28} M={m:<3} {q}: kernel/stream {kr / rates[f'{q} stream']:.1f}x, "
                      f"kernel/Q4_K kernel {kr / rates['Q4_K kernel']:.2f}x (bytes/s)")  # fmt: skip


if __name__ == "__main__":
    main()
