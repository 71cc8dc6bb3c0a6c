"""Which files of a hub repo a node needs. Pure: names and sizes in, names out."""

import re
from collections.abc import Mapping, Sequence

from exo.shared.models.model_cards import HubFile, is_mmproj

SAFETENSORS_INDEX = "model.safetensors.index.json"

# Small files the engine reads besides the weights: config, tokenizer, chat template.
_SUPPORT_SUFFIXES = (".json", ".jinja", ".model", ".txt", ".tiktoken")
_WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".onnx")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
# A vision-language checkpoint's image path (tower and projector: Gemma 3's, Qwen-VL's
# ``visual.``): it runs where the first pipeline stage runs.
_VISION = tuple(p + name for p in ("", "model.")
                for name in ("vision_tower.", "multi_modal_projector.", "visual."))  # fmt: skip
_SPLIT = re.compile(r"^(?P<stem>.*)-(?P<part>\d{5})-of-(?P<total>\d{5})\.gguf$")


def is_support_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return (
        "/" not in path
        and name.endswith(_SUPPORT_SUFFIXES)
        and not name.endswith(_WEIGHT_SUFFIXES)
        and not name.startswith(".")
    )


def support_files(files: Sequence[HubFile]) -> list[HubFile]:
    return [f for f in files if is_support_file(f.path)]


def safetensors_files_for_layers(
    weight_map: Mapping[str, str], start_layer: int, end_layer: int, n_layers: int
) -> set[str]:
    """The weight files holding layers [start_layer, end_layer): the embeddings (and a
    vision model's tower and projector) go with the first shard, the final norm and output
    head with the last (and the embeddings too when the head is tied to them)."""
    first, last = start_layer == 0, end_layer >= n_layers
    tied = not any(t.startswith("lm_head.") or ".lm_head." in t for t in weight_map)
    needed: set[str] = set()
    for tensor, file in weight_map.items():
        if tensor.startswith(_VISION):  # (its own numbered layers are not the model's)
            if first:
                needed.add(file)
            continue
        match = _LAYER.search(tensor)
        if match is not None:
            if start_layer <= int(match.group(1)) < end_layer:
                needed.add(file)
        elif "embed" in tensor:
            if first or (last and tied):
                needed.add(file)
        elif last:
            needed.add(file)
    return needed


def gguf_files(files: Sequence[HubFile]) -> list[HubFile]:
    return [f for f in files if f.path.endswith(".gguf")]


def model_gguf_files(files: Sequence[HubFile]) -> list[HubFile]:
    """The model's GGUF file(s) (every part of a split file), by name; not its mmproj."""
    return sorted((f for f in gguf_files(files) if not is_mmproj(f.path)), key=lambda f: f.path)


def mmproj_file(files: Sequence[HubFile]) -> HubFile | None:
    """A pinned file list's vision projector (an mmproj GGUF), if it has one."""
    return next((f for f in files if is_mmproj(f.path)), None)


# The vision projector's types a node prefers (the tower runs dequantised: F16 loses nothing
# worth the bytes of F32, and a quantised tower costs accuracy).
_MMPROJ_ORDER = ("F16", "F32", "BF16", "Q8_0")


def choose_mmproj(files: Sequence[HubFile]) -> HubFile | None:
    """The repo's mmproj file to download with the model: F16, then F32, BF16, Q8_0 by the
    type in its name (``mmproj-model-f16.gguf``), else the first by name; None without one."""
    found = sorted((f for f in files if is_mmproj(f.path) and "/" not in f.path),
                   key=lambda f: f.path)  # fmt: skip

    def rank(f: HubFile) -> int:
        stem = f.path.removesuffix(".gguf").upper()
        for i, kind in enumerate(_MMPROJ_ORDER):
            if re.search(rf"(?:^|[-._]){kind}(?:$|[-._])", stem):
                return i
        return len(_MMPROJ_ORDER)

    return min(found, key=rank) if found else None


def quant_of(path: str) -> str | None:
    """The quant named in a GGUF file name (``Model-Q4_K_M.gguf`` -> ``Q4_K_M``)."""
    name = path.rsplit("/", 1)[-1]
    split = _SPLIT.match(name)
    stem = split.group("stem") if split else name.removesuffix(".gguf")
    match = re.search(r"(?i)[-._]((?:IQ|Q)\d[A-Z0-9_]*|F16|BF16|F32)$", stem)
    return match.group(1).upper() if match else None


def choose_gguf(files: Sequence[HubFile], quant: str | None) -> list[HubFile] | str:
    """The file(s) of one quant (every part of a split GGUF), or why there are none.

    Without a quant: the only quant of the repo, or Q4_K_M, or the first of Q8_0 / F16."""
    by_quant: dict[str, list[HubFile]] = {}
    for f in model_gguf_files(files):
        q = quant_of(f.path)
        if q is not None:
            by_quant.setdefault(q, []).append(f)
    if not by_quant:
        return "the repo has no GGUF files"
    if quant is None:
        preferred = [q for q in ("Q4_K_M", "Q8_0", "F16") if q in by_quant]
        if len(by_quant) > 1 and not preferred:
            return f"name a quant (repo:QUANT); the repo has {', '.join(sorted(by_quant))}"
        quant = preferred[0] if preferred else next(iter(by_quant))
    chosen = by_quant.get(quant.upper())
    if chosen is None:
        return f"no {quant} file in the repo; it has {', '.join(sorted(by_quant))}"
    return sorted(chosen, key=lambda f: f.path)


def split_parts_complete(files: Sequence[HubFile]) -> bool:
    """A split GGUF lists every one of its parts."""
    totals = {int(m.group("total")) for f in files if (m := _SPLIT.match(f.path.rsplit("/", 1)[-1]))}
    if not totals:
        return True
    return len(totals) == 1 and len(files) == totals.pop()
