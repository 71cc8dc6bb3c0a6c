"""Which part of a model one runner holds."""

from typing import Annotated, Literal

from pydantic import Field

from exo.shared.models.model_cards import ModelCard
from exo.shared.types.common import FrozenModel


class PipelineShardMetadata(FrozenModel):
    """A contiguous layer range ``[start_layer, end_layer)`` of ``n_layers``."""

    kind: Literal["PipelineShardMetadata"] = "PipelineShardMetadata"
    model_card: ModelCard
    device_rank: int
    world_size: int
    start_layer: int
    end_layer: int
    n_layers: int

class TensorShardMetadata(FrozenModel):
    """A ``1 / world_size`` slice of every layer (heads and feed-forward columns)."""

    kind: Literal["TensorShardMetadata"] = "TensorShardMetadata"
    model_card: ModelCard
    device_rank: int
    world_size: int


ShardMetadata = Annotated[
    PipelineShardMetadata | TensorShardMetadata, Field(discriminator="kind")
]


def layer_range(shard: ShardMetadata) -> tuple[int, int]:
    """The layers whose weights a runner of ``shard`` reads: its range for a pipeline
    shard, every layer for a tensor shard."""
    if isinstance(shard, PipelineShardMetadata):
        return shard.start_layer, shard.end_layer
    return 0, shard.model_card.n_layers
