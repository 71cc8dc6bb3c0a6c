"""The model generator: random-weight models of any registered family, shape and quant, in
GGUF (as llama.cpp writes them) or as a safetensors folder, written tensor by tensor.

    from exo.modelgen import Request, generate
    generate(Request("llama", "1b", "Q4_K_M", Path("/tmp")))  # /tmp/exo-gen-llama-1b-Q4_K_M.gguf

The CLI is `bench/make_model.py`. Pieces: `families/` (one module per family: shapes, tensors,
metadata, special tokens, chat template), `recipes` (which type each tensor gets), `quants`
(row-chunk quantisers), `values` (peaked random values), `gguf_out` / `safetensors_out` (the
streaming writers), `vocab` (SmolLM2's vocabulary plus the family's tokens), `custom` (dense
models of any shape, for tests).
"""

from exo.modelgen.blueprint import FAMILIES, Blueprint, Family, TensorSpec, register
from exo.modelgen.generate import Request, generate, model_name
from exo.modelgen.recipes import RECIPES

__all__ = [
    "FAMILIES", "RECIPES", "Blueprint", "Family", "Request", "TensorSpec", "generate",
    "model_name", "register",
]  # fmt: skip
