"""Our Q4_1 kernel (`exo_qlinear`) against torch's own int4 CPU matmul
(`torch._weight_int4pack_mm_for_cpu`) on the same 4-bit weights, per SmolLM2-135M layer shape.

    python bench/int4pack.py [--rows 1 8 60] [--repeat 3]

Ours runs the layout the engine runs (on AVX2 the rows repacked in groups of 8, `QKernels.repack_rows`).
Both run the same quantised matrix: GGUF Q4_1 blocks of 32 (w = d q + m, q in 0..15), which
torch's layout holds exactly as groups of 32 with scale d and zero m + 8 d (it computes
(q - 8) scale + zero). Each is checked against the dequantised float32 product first. Figures
are microseconds of the process's CPU time per call at one thread (the machine may be shared),
best of `--repeat`; the last line sums a whole layer stack (qkv, o, gate_up, down) per row count.
torch is given bfloat16 activations and scales, its fast path on this CPU (with float32 ones its
kernel falls back to a path 10-50x slower still; `--torch-dtype float32` shows it); the engine
would then also convert activations to and from bfloat16, which is not counted.
"""

import argparse
import os
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from exo.worker.engines.cpu_kernels import (
    GROUPED,
    KIND_Q4,
    PROLOGUE_NONE,
    QuantWeights,
    load_kernels,
)
from exo.worker.engines.q_blocks import dequantize_blocks, quantize_q4, unpack_q4

LAYERS = [("qkv", 576, 960), ("o", 576, 576), ("gate_up", 576, 3072), ("down", 1536, 576)]
GROUP = 32
# torch's private int4 CPU ops (not exported in its type stubs)
_to_int4pack = torch._convert_weight_to_int4pack_for_cpu  # pyright: ignore[reportPrivateImportUsage]
_int4_mm = torch._weight_int4pack_mm_for_cpu  # pyright: ignore[reportPrivateImportUsage]


def torch_int4(blocks: Tensor) -> tuple[Tensor, Tensor]:
    """q4 blocks [N, K/32, 20] -> torch's packed weight and scales-and-zeros [K/32, N, 2]."""
    q, d, m = unpack_q4(blocks)  # q [N, nb, 32], d and m [N, nb, 1]
    d, m = d[..., 0], m[..., 0]
    packed = _to_int4pack(q.flatten(-2).to(torch.int32), 2)  # q as [N, K]
    scales_zeros = torch.stack([d, m + 8 * d], dim=-1).transpose(0, 1).contiguous()
    return packed, scales_zeros


def best_us(call: Callable[[], object], repeat: int, calls: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.process_time()
        for _ in range(calls):
            call()
        best = min(best, (time.process_time() - t) / calls)
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 60])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--torch-dtype", choices=["bfloat16", "float32"], default="bfloat16")
    args = ap.parse_args()
    dtype = getattr(torch, args.torch_dtype)
    torch.set_num_threads(1)
    kernels = load_kernels()
    if kernels is None:
        sys.exit("the CPU kernels did not build here (see the log): nothing to measure")
    kernels.set_threads(1)
    torch.manual_seed(0)
    print(f"Q4_1 linear at 1 thread, CPU us per call: ours ({kernels.isa}, float32) / torch "
          f"int4pack ({args.torch_dtype})")
    print(f"{'layer':<10}" + "".join(f"{f'M={m} ours':>12}{'torch':>9}{'ratio':>7}" for m in args.rows))
    totals = {m: [0.0, 0.0] for m in args.rows}
    for name, k, n in LAYERS:
        blocks = quantize_q4(torch.randn(n, k) * 0.05).reshape(n, k // GROUP, 20)
        rows = blocks.reshape(n, -1).clone()
        kinds = [KIND_Q4]
        if kernels.x86:  # as the engine runs them
            kernels.repack_rows(KIND_Q4, rows, rows)
            kinds = [GROUPED[KIND_Q4]]
        ours = QuantWeights(KIND_Q4, PROLOGUE_NONE, [rows], None, 1e-5, None, k, kinds)
        packed, scales_zeros = torch_int4(blocks)
        scales_zeros = scales_zeros.to(dtype)
        dense = dequantize_blocks(blocks, 4)
        line = f"{name:<10}"
        for m in args.rows:
            x = torch.randn(m, k)
            want = x @ dense.T
            got_ours = kernels.linear(ours, x)
            xt = x.to(dtype)
            got_torch = _int4_mm(xt, packed, GROUP, scales_zeros)
            scale = want.abs().max().item()
            for who, got, tol in (("ours", got_ours, 1e-3), ("torch", got_torch.float(), 3e-2)):
                err = (got - want).abs().max().item() / scale
                if err > tol:
                    sys.exit(f"{name} M={m}: {who} differs from the float product by {err:.2e}")
            calls = max(3, int(1e8 // (m * n * k)))
            t_ours = best_us(partial(kernels.linear, ours, x), args.repeat, calls)
            t_torch = best_us(partial(_int4_mm, xt, packed, GROUP, scales_zeros), args.repeat, calls)
            totals[m][0] += t_ours
            totals[m][1] += t_torch
            line += f"{t_ours:>12.1f}{t_torch:>9.1f}{t_torch / t_ours:>6.2f}x"
        print(line)
    print(f"{'stack':<10}" + "".join(
        f"{a:>12.1f}{b:>9.1f}{b / a:>6.2f}x" for a, b in totals.values()))  # fmt: skip
    print("ratio = torch's time / ours: above 1, ours is faster")


if __name__ == "__main__":
    main()
