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
    addresses: list[str] = []
    """This node's interface addresses with their prefix length (``192.168.1.7/24``):
    the ones other machines may reach first, loopback last. Rendezvous of instances
    spanning machines are chosen from these."""

    @property
    def available_for_models(self) -> Memory:
        """Memory a model may use on this node: GPU memory when there is a GPU."""
        if self.gpus:
            return Memory(in_bytes=sum(g.memory_available.in_bytes for g in self.gpus))
        return self.memory_available
