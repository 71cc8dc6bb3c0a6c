"""The stages a layer-range model has around its own layers (`base.ShardModel`): the
embedding, the head, a whole forward and the final hidden states, over the model's
`forward_layers` and `new_cache`. A family with extras at either end (Gemma's embedding scale
and logit cap, a vision model's image rows: `dense.py`) writes its own."""

import torch
from torch import Tensor

from exo.worker.engines.embedding import Embedding
from exo.worker.engines.kv_cache import KVCache
from exo.worker.engines.linear import Linear
from exo.worker.engines.models.base import StepInputs
from exo.worker.engines.models.norms import rms_norm


class ShardStages:
    """embed / head / forward / final_hidden of a model that sets these attributes (None where
    its layer range does not hold the part) and defines `forward_layers` and `new_cache`."""

    embedding: Embedding | None
    lm_head: Linear | None
    final_norm: Tensor | None
    eps: float
    device: torch.device

    def forward_layers(self, hidden: Tensor, step: StepInputs, cache: KVCache) -> Tensor:
        raise NotImplementedError

    def new_cache(self, max_batch: int, max_seq: int) -> KVCache:
        raise NotImplementedError

    def embed(self, tokens: Tensor) -> Tensor:
        """tokens [B, T] -> hidden [B, T, D] (first shard only)."""
        if self.embedding is None:
            raise RuntimeError("this shard does not hold the embedding (start_layer > 0)")
        return self.embedding(tokens.to(self.device))

    def head(self, hidden: Tensor) -> Tensor:
        """hidden [..., D] -> logits [..., V] (float32; last shard only)."""
        if self.lm_head is None:
            raise RuntimeError("this shard does not hold the head (end_layer < n_layers)")
        return self.lm_head(hidden).float()

    def forward(
        self, tokens: Tensor, step: StepInputs, cache: KVCache, every_position: bool = False
    ) -> Tensor:
        """Whole model (single shard): tokens [B, T] -> logits of the last position [B, V]
        (of every position [B, T, V] with ``every_position``)."""
        hidden = self.forward_layers(self.embed(tokens), step, cache)
        return self.head(hidden if every_position else hidden[:, -1])

    def final_hidden(self, tokens: Tensor) -> Tensor:
        """Whole model (single shard): tokens [1, T] -> final hidden states [T, D] after the
        final norm (float32), on a scratch cache of T positions."""
        if self.final_norm is None:
            raise RuntimeError("this shard does not hold the final norm (end_layer < n_layers)")
        n = int(tokens.shape[1])
        hidden = self.forward_layers(
            self.embed(tokens), StepInputs.single(0, 0, n), self.new_cache(1, n)
        )
        return rms_norm(hidden[0], self.final_norm, self.eps).float()
