"""The token embedding: rows of the table looked up per step, in the engine dtype.

The table stays in its running format: the file's blocks (`QuantTensor`, e.g. Q8_0 or Q6_K:
only the looked-up rows are dequantised, by the C kernels where they are loaded and take the
layout, else by gguf-py: the same values), q8 blocks for a float table when the quantised
formats run (shared with a tied q8 head), or a plain tensor.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from exo.worker.engines.cpu_kernels import QKernels
from exo.worker.engines.kinds import BY_GGML
from exo.worker.engines.linear import (
    QUANT_BLOCK,
    Linear,
    QuantLinear,
    WeightFormat,
    dequantize_blocks,
    quantize_q8,
)
from exo.worker.engines.qtensor import QuantTensor, Weight


class Embedding:
    def __init__(
        self,
        table: Weight,
        fmt: WeightFormat,
        dtype: torch.dtype,
        device: torch.device,
        tied_head: Linear | None = None,
        kernels: QKernels | None = None,
    ) -> None:
        """`kernels`: the C kernels that dequantise a file table's rows (a tied head's own
        are used when it has them); without them gguf-py does, slower (~0.6 ms a decode step
        at the 1B shape, the step's weights having flushed its caches)."""
        self.dtype, self.device = dtype, device
        self._file_blocks: QuantTensor | None = None
        self._q8_blocks: Tensor | None = None  # [V, D/32, 34]
        self._table: Tensor | None = None  # [V, D]
        # A tied head whose blocks are the table's rows (read back in the file's layout: the
        # head may have re-laid them in groups of rows for its kernel). With a file table, the
        # table's blocks as the head holds them; else the head's own q8 blocks.
        self._head: QuantLinear | None = None
        self._kernels = tied_head.native[0] if isinstance(tied_head, QuantLinear) else kernels
        if isinstance(table, QuantTensor):
            self._file_blocks = table
            if (
                isinstance(tied_head, QuantLinear)
                and len({k.name for k in tied_head.file_kinds}) == 1  # (a split head: 2 parts)
                and tied_head.parts[0].data_ptr() == table.raw.data_ptr()
            ):
                self._head = tied_head
        elif isinstance(tied_head, QuantLinear) and tied_head.file_kinds[0].name == "Q8_0":
            self._head = tied_head
        elif fmt in ("q4", "q8") and table.shape[1] % QUANT_BLOCK == 0:
            self._q8_blocks = quantize_q8(table)
        else:
            self._table = table.to(device=device)  # its own dtype: rows converted per lookup

    @property
    def n_bytes(self) -> int:
        """Bytes this table holds of its own (0 when it shares the head's blocks)."""
        if self._file_blocks is not None:
            return self._file_blocks.n_bytes
        if self._table is not None:
            return self._table.numel() * self._table.element_size()
        return 0

    @property
    def format(self) -> str:
        if self._file_blocks is not None:
            return self._file_blocks.qtype.name
        if self._q8_blocks is not None or self._head is not None:
            return "q8"
        assert self._table is not None
        return str(self._table.dtype).removeprefix("torch.")

    def __call__(self, tokens: Tensor) -> Tensor:
        """tokens [B, T] -> [B, T, D]."""
        if self._file_blocks is not None:
            table = self._file_blocks
            index = tokens.flatten().cpu()
            found = (self._head.block_rows(index) if self._head is not None
                     else table.take_rows(index).raw)  # fmt: skip
            kind = BY_GGML.get(table.qtype)
            rows = (None if self._kernels is None or kind is None or not found.is_cpu
                    else self._kernels.dequant_rows(kind.kernel, found, table.in_features))  # fmt: skip
            if rows is None:
                rows = QuantTensor(table.qtype, found, table.in_features).dequantize()
            return rows.reshape(*tokens.shape, -1).to(device=self.device, dtype=self.dtype)
        if self._head is not None:  # the head's q8 blocks
            return dequantize_blocks(self._head.block_rows(tokens).reshape(*tokens.shape, -1, 34), 8)
        if self._q8_blocks is not None:
            return dequantize_blocks(self._q8_blocks[tokens], 8)
        assert self._table is not None
        return F.embedding(tokens, self._table).to(self.dtype)
