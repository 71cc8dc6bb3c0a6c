"""gpt-oss's MXFP4 safetensors (`*_blocks` / `*_scales`) re-laid as GGUF's MXFP4 blocks.

Both formats hold 32 values per block as 4-bit e2m1 codes (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their
negatives) times a power of two 2^(s - 127) (an 8-bit exponent s):

    safetensors   blocks [.., G, 16] bytes: byte j holds value 2j (low nibble) and 2j + 1 (high);
                  scales [.., G]: s
    GGUF MXFP4    17 bytes a block: s, then 16 bytes: byte j holds value j (low), j + 16 (high)

so a block is re-laid by moving nibbles, exactly: no value is rounded, nothing is floated.
"""

import torch
from gguf import GGMLQuantizationType
from torch import Tensor

from exo.worker.engines.materialise import TensorSource
from exo.worker.engines.models.moe import ExpertWeights
from exo.worker.engines.models.moe_files import float_tensor
from exo.worker.engines.qtensor import QuantTensor

MXFP4 = GGMLQuantizationType.MXFP4


def gguf_blocks(blocks: Tensor, scales: Tensor) -> Tensor:
    """blocks uint8 [.., G, 16], scales uint8 [.., G] -> GGUF MXFP4 rows uint8 [.., G * 17]."""
    if blocks.shape[-1] != 16 or blocks.shape[:-1] != scales.shape:
        raise ValueError(
            f"MXFP4 blocks {list(blocks.shape)} and scales {list(scales.shape)} do not match"
        )
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).flatten(-2)  # [.., G, 32]
    qs = codes[..., :16] | (codes[..., 16:] << 4)
    out = torch.cat([scales.unsqueeze(-1), qs], dim=-1)  # [.., G, 17]
    return out.flatten(-2).contiguous()


def _raw(src: TensorSource, name: str) -> Tensor:
    st = src.stored(name)
    if st.kind.upper() != "U8":
        raise ValueError(f"{name}: MXFP4 parts are uint8, not {st.kind}")
    rows = 1
    for d in st.shape[:-1]:
        rows *= d
    return st.reader.read_rows(name, 0, rows).reshape(st.shape)


def _merged(src: TensorSource, name: str) -> Tensor:
    """[E, R, C / 32 * 17]: a merged tensor's MXFP4 rows in GGUF's layout."""
    return gguf_blocks(_raw(src, name + "_blocks"), _raw(src, name + "_scales"))


def hf_mxfp4_experts(src: TensorSource, prefix: str, n_experts: int) -> ExpertWeights:
    """gpt-oss's MXFP4 experts: gate_up [E, 2F, D] (gate and up rows interleaved), down
    [E, D, F], as MXFP4 `QuantTensor`s of one expert each."""
    gate_up, down = _merged(src, prefix + "gate_up_proj"), _merged(src, prefix + "down_proj")
    if gate_up.shape[0] != n_experts or down.shape[0] != n_experts:
        raise ValueError(f"{prefix}: expected {n_experts} MXFP4 experts")
    d_in, f_in = gate_up.shape[-1] // 17 * 32, down.shape[-1] // 17 * 32
    bias = float_tensor(src, prefix + "gate_up_proj_bias")
    return ExpertWeights(
        gate=[QuantTensor(MXFP4, gate_up[e, 0::2].contiguous(), d_in) for e in range(n_experts)],
        up=[QuantTensor(MXFP4, gate_up[e, 1::2].contiguous(), d_in) for e in range(n_experts)],
        down=[QuantTensor(MXFP4, down[e], f_in) for e in range(n_experts)],
        gate_bias=bias[:, 0::2].contiguous(),
        up_bias=bias[:, 1::2].contiguous(),
        down_bias=float_tensor(src, prefix + "down_proj_bias"),
    )
