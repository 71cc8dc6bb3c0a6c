"""The families the generator writes, one module each; importing this package registers them.

A new family is a module here that defines a `Family` and calls `register`, plus its name in
`MODULES`.
"""

import importlib

from exo.modelgen.blueprint import FAMILIES, Family

MODULES = (
    "llama", "qwen3", "qwen3moe", "gpt_oss", "deepseek2", "glm4moe", "gemma3_vision", "qwen_vl"
)

for _module in MODULES:
    importlib.import_module(f"{__name__}.{_module}")


def family(name: str) -> Family:
    """The family called `name`; ValueError naming the known ones otherwise."""
    if name not in FAMILIES:
        raise ValueError(f"unknown ARCH {name!r} (choose from {', '.join(FAMILIES)})")
    return FAMILIES[name]
