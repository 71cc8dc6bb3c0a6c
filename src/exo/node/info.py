"""What this machine offers: memory, CPUs, NVIDIA GPUs (without importing torch), and
the addresses other machines may reach it at."""

import ipaddress
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
        addresses=interface_addresses(),
    )


def interface_addresses() -> list[str]:
    """Addresses of this machine's interfaces as ``address/prefix``: IPv4 first, then
    IPv6, loopback last. IPv6 link-local addresses are left out (they only mean
    something with an interface scope)."""
    found: list[tuple[tuple[bool, int], str]] = []
    for addrs in psutil.net_if_addrs().values():
        for addr in addrs:
            if addr.family not in (socket.AF_INET, socket.AF_INET6) or not addr.netmask:
                continue
            try:
                ip = ipaddress.ip_address(addr.address.split("%", 1)[0])
                prefix = bin(int(ipaddress.ip_address(addr.netmask))).count("1")
            except ValueError:
                continue
            if ip.is_link_local and ip.version == 6:
                continue
            found.append(((ip.is_loopback, ip.version), f"{ip}/{prefix}"))
    return [text for _, text in sorted(found, key=lambda item: item[0])]


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
    if (a.hostname, a.cpu_count, a.api_port, len(a.gpus), a.addresses) != (
        b.hostname, b.cpu_count, b.api_port, len(b.gpus), b.addresses
    ):
        return True
    diff = abs(a.available_for_models.in_bytes - b.available_for_models.in_bytes)
    return diff > threshold_bytes


def cap_memory(info: NodeInfo, limit: int) -> NodeInfo:
    """The node as placement should see it under ``--memory-limit``: no more than
    ``limit`` bytes for models (GPU memory shared out evenly when there are GPUs)."""
    per_gpu = limit // max(len(info.gpus), 1)
    return info.model_copy(
        update={
            "memory_total": Memory(in_bytes=min(info.memory_total.in_bytes, limit)),
            "memory_available": Memory(in_bytes=min(info.memory_available.in_bytes, limit)),
            "gpus": [
                g.model_copy(update={"memory_available": Memory(
                    in_bytes=min(g.memory_available.in_bytes, per_gpu))})
                for g in info.gpus
            ],
        }
    )
