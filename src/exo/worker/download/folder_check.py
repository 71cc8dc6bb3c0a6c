"""Is a safetensors folder whole? Every file its index lists is there, and every file
holds the bytes its own header promises. Checked before a folder is offered as a model
or reported downloaded, so a partial copy fails with a reason instead of in the runner."""

import json
import struct
from pathlib import Path
from typing import Any, cast

from exo.shared.models.hub_files import SAFETENSORS_INDEX
from exo.worker.download.hub_names import file_name_problem

MAX_HEADER_BYTES = 100 << 20
"""The safetensors format's own limit on the JSON header (100 MB)."""


def safetensors_problem(path: Path) -> str | None:
    """Why one .safetensors file cannot be loaded as it is (None: it looks whole)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                return f"{path.name} has {size} bytes: too short for a safetensors header"
            (length,) = struct.unpack("<Q", head)
            if length > MAX_HEADER_BYTES or 8 + length > size:
                return (f"{path.name}: its header length says {length} bytes; the file has "
                        f"{size} (the limit is {MAX_HEADER_BYTES})")
            header = json.loads(fh.read(length))
    except OSError as e:
        return f"{path.name} cannot be read ({e.strerror or type(e).__name__})"
    except (ValueError, UnicodeDecodeError) as e:
        return f"{path.name}: its header is not valid JSON ({e})"
    end = _data_end(header)
    if end is None:
        return f"{path.name}: its header is not a safetensors tensor table"
    if 8 + length + end > size:
        return (f"{path.name} is truncated: it has {size} bytes, its tensors need "
                f"{8 + length + end}")
    return None


def _data_end(header: object) -> int | None:
    if not isinstance(header, dict):
        return None
    end = 0
    for name, entry in cast(dict[str, Any], header).items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not isinstance(offsets, list) or len(cast(list[Any], offsets)) != 2:
            return None
        last = cast(list[Any], offsets)[1]
        if not isinstance(last, int):
            return None
        end = max(end, last)
    return end


def folder_problem(folder: Path) -> str | None:
    """Why a safetensors model folder is not whole (None: every file is there and whole)."""
    index = folder / SAFETENSORS_INDEX
    if index.exists():
        try:
            weight_map = cast(dict[str, str], json.loads(index.read_text())["weight_map"])
            listed = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            return f"{folder}: {SAFETENSORS_INDEX} is unreadable ({type(e).__name__}: {e})"
        unsafe = [name for name in listed if file_name_problem(name) is not None]
        if unsafe:
            return f"{folder}: {SAFETENSORS_INDEX} names files outside the folder: {unsafe}"
        missing = [name for name in listed if not (folder / name).is_file()]
        if missing:
            return (f"{folder} is incomplete: missing {', '.join(missing)} (listed in "
                    f"{SAFETENSORS_INDEX})")
        files = [folder / name for name in listed]
    else:
        files = sorted(folder.glob("*.safetensors"))
    for file in files:
        problem = safetensors_problem(file)
        if problem is not None:
            return f"{folder}: {problem}"
    return None
