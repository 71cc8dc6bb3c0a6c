"""Words for placement's refusals. Pure."""

from exo.shared.types.memory import Memory


def largest(k: int) -> str:
    return (
        "the node with the most free memory" if k == 1 else f"the largest connected {k}-node group"
    )


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def fmt(n_bytes: int) -> str:
    mb = Memory.from_bytes(n_bytes).in_mb
    if mb >= 10 * 1024:
        return f"{mb / 1024:.1f} GB"
    if mb >= 10 or mb == int(mb):
        return f"{mb:.0f} MB"
    return f"{mb:.1f} MB"
