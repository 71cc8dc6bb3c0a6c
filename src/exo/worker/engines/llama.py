"""The dense Llama-family model under its former names (`models/dense.py` holds the code; the
step inputs and all-reduce hook are in `models/base.py`)."""

from exo.worker.engines.models.base import AllReduce, StepInputs, no_all_reduce
from exo.worker.engines.models.dense import Block, DenseModel, build_block, head_format

LlamaModel = DenseModel

__all__ = [
    "AllReduce",
    "Block",
    "DenseModel",
    "LlamaModel",
    "StepInputs",
    "build_block",
    "head_format",
    "no_all_reduce",
]
