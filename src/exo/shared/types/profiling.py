"""What a node reports about itself."""

from exo.shared.types.common import FrozenModel
from exo.shared.types.memory import Memory


class GpuInfo(FrozenModel):
    name: str
    memory_total: Memory
    memory_available: Memory


class NodeInfo(FrozenModel):
    hostname: str
    cpu_count: int
    memory_total: Memory
    memory_available: Memory
    gpus: list[GpuInfo] = []
    api_port: int | None = None

    @property
    def available_for_models(self) -> Memory:
        """Memory a model may use on this node: GPU memory when there is a GPU."""
        if self.gpus:
            return Memory(in_bytes=sum(g.memory_available.in_bytes for g in self.gpus))
        return self.memory_available
