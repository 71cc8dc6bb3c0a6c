"""What this machine offers: memory, CPUs and NVIDIA GPUs (without importing torch)."""

import shutil
import socket
import subprocess

import psutil

from exo.shared.types.memory import Memory
from exo.shared.types.profiling import GpuInfo, NodeInfo


def gather_node_info(api_port: int | None) -> NodeInfo:
    vm = psutil.virtual_memory()
    return NodeInfo(
        hostname=socket.gethostname(),
        cpu_count=psutil.cpu_count() or 1,
        memory_total=Memory(in_bytes=vm.total),
        memory_available=Memory(in_bytes=vm.available),
        gpus=_nvidia_gpus(),
        api_port=api_port,
    )


def _nvidia_gpus() -> list[GpuInfo]:
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,memory.free",
             "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus: list[GpuInfo] = []
    for line in out.strip().splitlines():
        name, total, free = (part.strip() for part in line.split(","))
        gpus.append(GpuInfo(name=name, memory_total=Memory.from_mb(float(total)),
                            memory_available=Memory.from_mb(float(free))))
    return gpus


def significantly_different(a: NodeInfo, b: NodeInfo, threshold_bytes: int = 256 << 20) -> bool:
    """Telemetry is only worth a log entry when it changed by more than the threshold."""
    if (a.hostname, a.cpu_count, a.api_port, len(a.gpus)) != (
        b.hostname, b.cpu_count, b.api_port, len(b.gpus)
    ):
        return True
    diff = abs(a.available_for_models.in_bytes - b.available_for_models.in_bytes)
    return diff > threshold_bytes
