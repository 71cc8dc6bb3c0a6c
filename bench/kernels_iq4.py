"""Speed of the native MXFP4 / IQ4_NL / IQ4_XS kernels against the streaming dequantiser they
replace, at real MoE expert shapes.

    python bench/kernels_iq4.py [--threads 1] [--rows 1 8] [--repeat 3]

Shapes: a Qwen3-30B-A3B expert's gate (or up: 2048 -> 768) and down (768 -> 2048), and gpt-oss-20b's
(2880 -> 2880: no IQ4_XS there, 2880 is not a multiple of 256: llama.cpp writes such rows in
IQ4_NL). Each layer's random blocks (`modelgen.quants.random_blocks`) run through the engine's
`QuantLinear` (the native kernel) and `StreamingLinear` (gguf.quants dequantising the matrix on
every call, what these types ran on before), with Q4_0 and Q4_K on the native kernels at the same
shape for comparison. Figures are microseconds of the process's CPU time per call, best of
`--repeat`; the ratio is streaming / native (how many times faster the kernel is), measured in
the same run.
"""

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from gguf import GGMLQuantizationType

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from exo.modelgen.quants import random_blocks
from exo.worker.engines.cpu_kernels import load_kernels
from exo.worker.engines.linear import QuantLinear, StreamingLinear, make_linear
from exo.worker.engines.qtensor import QuantTensor

T = GGMLQuantizationType
SHAPES = [("qwen3-30b expert gate/up", 2048, 768), ("qwen3-30b expert down", 768, 2048),
          ("gpt-oss-20b expert", 2880, 2880)]  # fmt: skip
NATIVE = [T.MXFP4, T.IQ4_NL, T.IQ4_XS]
CONTEXT = [T.Q4_0, T.Q4_K]  # the older native kinds at the same shape


def cpu_us(
    layer: Callable[[torch.Tensor], object], x: torch.Tensor, repeat: int, min_seconds: float = 0.2
) -> float:
    """Best-of-`repeat` CPU microseconds per call of layer(x) (each round runs >= min_seconds)."""
    layer(x)
    best = float("inf")
    for _ in range(repeat):
        n, start = 0, time.process_time()
        while True:
            layer(x)
            n += 1
            spent = time.process_time() - start
            if spent >= min_seconds:
                break
        best = min(best, spent / n)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    kernels = load_kernels()
    if kernels is None:
        sys.exit("the CPU kernels did not build here (see the log): nothing to measure")
    kernels.set_threads(args.threads)
    print(f"the {kernels.isa} build, {args.threads} thread(s), CPU us per call; native/streaming: "
          "the native kernel's speed over the streaming dequantiser's (its time over ours)")  # fmt: skip
    for label, k, n in SHAPES:
        for qtype in NATIVE + CONTEXT:
            if k % 256 and qtype in (T.IQ4_XS, T.Q4_K):
                continue
            raw = torch.from_numpy(random_blocks(qtype, n, k, seed=1))
            native = make_linear(QuantTensor(qtype, raw, k), None, "q8", kernels=kernels)
            assert isinstance(native, QuantLinear), native.kernel
            streaming = StreamingLinear(QuantTensor(qtype, raw, k), None, None, torch.float32,
                                        torch.device("cpu"))  # fmt: skip
            for m in args.rows:
                x = torch.randn(m, k)
                fast = cpu_us(native, x, args.repeat)
                line = f"{label} {k}->{n} {qtype.name:<6} M={m}: native {fast:9.1f} us"
                if qtype in NATIVE:
                    slow = cpu_us(streaming, x, args.repeat)
                    line += f", streaming {slow:10.1f} us: native/streaming {slow / fast:.1f}x"
                print(line, flush=True)


if __name__ == "__main__":
    main()
