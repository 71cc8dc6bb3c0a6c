"""The weight-kind table is one table in two languages: the Python rows (`kinds.KINDS`), the C
enum (`csrc/exo_kernels.h`) and the C traits rows (`csrc/kinds.c`) must say the same thing, or a
kind would be refused (or misread) only at run time."""

import re

import pytest

from exo.worker.engines.kernel_build import csrc_dir
from exo.worker.engines.kinds import BY_KERNEL, KINDS, Kind, layout_name

_ENUM_LINE = re.compile(r"^\s*KIND_(\w+) = (\d+),$", re.MULTILINE)
_ROW = re.compile(
    r'\{\.kind = KIND_(\w+),\s+\.name = "(\w+)",\s+\.file_kind = KIND_(\w+),\s+'
    r"\.grouped = (KIND_\w+|0),\s+\.block_values = (\d+),\s+\.block_bytes = (\d+),"
)


def c_enum(header: str) -> dict[str, int]:
    body = header[header.index("enum {\n    KIND_") : header.index("};", header.index("KIND_"))]
    return {name: int(value) for name, value in _ENUM_LINE.findall(body)}


def c_rows(source: str) -> dict[str, tuple[str, str, str, int, int]]:
    """name -> (its name string, file kind, grouped kind or "0", block values, block bytes)"""
    rows = {m[0]: (m[1], m[2], m[3], int(m[4]), int(m[5])) for m in _ROW.findall(source)}
    assert len(rows) == source.count("{.kind = "), "a row of kinds.c does not parse"
    return rows


def expected_rows(kinds: tuple[Kind, ...]) -> dict[str, tuple[str, str, str, int, int]]:
    rows: dict[str, tuple[str, str, str, int, int]] = {}
    for k in kinds:
        grouped = "0" if k.grouped is None else f"KIND_{k.name}_G8"
        rows[k.name] = (k.name, k.name, grouped, k.block_values, k.block_bytes)
        if k.grouped is not None:
            name = f"{k.name}_G8"
            rows[name] = (name, k.name, "0", k.block_values, k.block_bytes)
    return rows


def expected_enum(kinds: tuple[Kind, ...]) -> dict[str, int]:
    enum = {k.name: k.kernel for k in kinds}
    enum.update({f"{k.name}_G8": k.grouped for k in kinds if k.grouped is not None})
    return enum


def test_the_c_enum_is_the_python_table() -> None:
    header = (csrc_dir() / "exo_kernels.h").read_text(encoding="utf-8")
    assert c_enum(header) == expected_enum(KINDS)


def test_the_c_traits_rows_are_the_python_table() -> None:
    source = (csrc_dir() / "kinds.c").read_text(encoding="utf-8")
    assert c_rows(source) == expected_rows(KINDS)


def test_a_mismatch_is_caught() -> None:
    """The checks above fail when one side changes alone (a new row, a wrong size, an id)."""
    header = (csrc_dir() / "exo_kernels.h").read_text(encoding="utf-8")
    source = (csrc_dir() / "kinds.c").read_text(encoding="utf-8")
    changed = header.replace("KIND_Q5_1 = 51,", "KIND_Q5_1 = 52,")
    assert c_enum(changed) != expected_enum(KINDS)
    q6k = re.search(r'\.name = "Q6_K",[^}]*?\.block_bytes = 210', source)
    assert q6k is not None
    changed = source.replace(q6k.group(0), q6k.group(0).replace("210", "208"))
    assert changed != source and c_rows(changed) != expected_rows(KINDS)
    extra = Kind("TQ2_0", KINDS[0].ggml.__class__.TQ2_0, 135, None)  # a type with no row
    assert c_rows(source) != expected_rows((*KINDS, extra))


def test_every_kernel_id_names_one_layout() -> None:
    ids = [k.kernel for k in KINDS] + [k.grouped for k in KINDS if k.grouped is not None]
    assert len(ids) == len(set(ids)) == len(BY_KERNEL)
    assert layout_name(KINDS[0].kernel) == "Q4_1"
    assert layout_name(204) == "Q4_1 (8-row groups)"
    with pytest.raises(KeyError):
        layout_name(5)
