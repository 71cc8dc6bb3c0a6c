"""Generate one model file (or folder) of a registered family: the tool's entry point.

The model is named `exo-gen-ARCH-SHAPE-QUANT` (`general.name` in a GGUF, and the default file or
folder name): a node serving `--model PATH` names the model after the file, so the default
name puts ARCH in the model id.
"""

from dataclasses import dataclass
from pathlib import Path

from exo.modelgen.families import family
from exo.modelgen.gemma3_pair import PAIR_QUANTS, pair_paths, write_gemma3_pair
from exo.modelgen.gguf_out import Progress, write_gguf
from exo.modelgen.qwen_vl_pair import write_qwen_vl_pair
from exo.modelgen.recipes import FLOAT_RECIPES, recipe
from exo.modelgen.safetensors_out import write_safetensors
from exo.modelgen.values import CHUNK_VALUES
from exo.modelgen.vocab import vocabulary


@dataclass(frozen=True)
class Request:
    arch: str
    shape: str
    quant: str
    out: Path
    layers: int | None = None
    safetensors: bool = False
    seed: int = 0
    tokenizer_source: Path | None = None  # another GGUF's vocabulary (default: SmolLM2's)


def model_name(arch: str, shape: str, quant: str, layers: int | None = None) -> str:
    suffix = f"-{layers}L" if layers is not None else ""
    return f"exo-gen-{arch}-{shape}{suffix}-{quant}"


def output_path(req: Request) -> Path:
    """--out as given, or (an existing folder, for a GGUF) the default name inside it."""
    name = model_name(req.arch, req.shape, req.quant, req.layers)
    if not req.safetensors and req.out.is_dir():
        return req.out / f"{name}.gguf"
    return req.out


def validate(req: Request) -> None:
    """Every problem a request can have before anything is written (ValueError)."""
    fam = family(req.arch)
    r = recipe(req.quant)
    fam.blueprint(req.shape, req.layers, 1024)  # unknown shape, bad --layers
    if req.safetensors and fam.safetensors is not None:
        raise ValueError(f"--safetensors is not offered for {fam.name}: {fam.safetensors}")
    if fam.safetensors_only and not req.safetensors:
        raise ValueError(f"{fam.name} is written as a safetensors folder only: add --safetensors")
    if fam.mmproj_pair and not req.safetensors:
        _validate_pair(req)
        return
    if req.safetensors and r.name not in FLOAT_RECIPES:
        raise ValueError(
            f"--safetensors writes float weights: --quant {' | '.join(FLOAT_RECIPES)}, not {r.name}"
        )
    path = output_path(req)
    if req.safetensors and path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ValueError(f"--out {path} exists and is not an empty folder")
    if not req.safetensors and path.suffix != ".gguf":
        raise ValueError(f"--out {path}: a GGUF file's name ends in .gguf (or name a folder)")
    if not path.parent.is_dir():
        raise ValueError(f"--out {path}: folder {path.parent} does not exist")


def _validate_pair(req: Request) -> None:
    """A GGUF + mmproj pair: float weights; --out a .gguf file or a folder (made if missing)."""
    if req.quant.upper() not in PAIR_QUANTS:
        raise ValueError(f"{req.arch}'s GGUF and mmproj pair is written in "
                         f"{' or '.join(PAIR_QUANTS)}, not {req.quant}")  # fmt: skip
    text, _ = pair_paths(req.out, model_name(req.arch, req.shape, req.quant, req.layers))
    if text.exists():
        raise ValueError(f"--out: {text} exists")
    if not text.parent.parent.is_dir():
        raise ValueError(f"--out {req.out}: folder {text.parent.parent} does not exist")


def generate(
    req: Request, *, chunk_values: int = CHUNK_VALUES, progress: Progress | None = None
) -> Path:
    """Write the model; returns its path (a .gguf file or a safetensors folder)."""
    validate(req)
    fam, r = family(req.arch), recipe(req.quant)
    vocab = vocabulary(fam.chat, req.tokenizer_source)
    bp = fam.blueprint(req.shape, req.layers, vocab.size)
    path = output_path(req)
    if fam.mmproj_pair and not req.safetensors:
        name = model_name(req.arch, req.shape, req.quant, req.layers)
        writer = write_qwen_vl_pair if fam.name in ("qwen2.5-vl", "qwen3-vl") else write_gemma3_pair
        return writer(req.out, bp, r, vocab, name=name, seed=req.seed)
    if req.safetensors:
        write_safetensors(path, bp, r.base, vocab, seed=req.seed, chunk_values=chunk_values)
        fam.write_extra(path)
        return path
    name = model_name(req.arch, req.shape, req.quant, req.layers)
    return write_gguf(path, bp, r, vocab, name=name, seed=req.seed, chunk_values=chunk_values,
                      progress=progress)  # fmt: skip
