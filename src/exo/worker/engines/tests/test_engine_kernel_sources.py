"""The kernel library is built from every source under `csrc/` (the generic files and each
`arch/` folder's), and its cache key covers every one of them: a change to any file, a new file,
or a file moved between folders gives a new library name, so a stale build is never loaded."""

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from exo.worker.engines import kernel_build
from exo.worker.engines.kernel_build import csrc_dir, kernel_sources, library_name


@pytest.fixture
def csrc_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    copy = tmp_path / "csrc"
    shutil.copytree(csrc_dir(), copy)
    monkeypatch.setattr(kernel_build, "csrc_dir", lambda: copy)
    return copy


def test_every_generic_and_arch_source_is_compiled() -> None:
    sources = kernel_sources()
    assert {"linear.c", "kinds.c", "repack.c", "dot.c", "arch/x86/dot.c", "arch/x86/tile.c"} <= set(
        sources
    )
    assert not [s for s in sources if s.startswith("harness/")]
    on_disk = {p.relative_to(csrc_dir()).as_posix() for p in csrc_dir().rglob("*.c")} - {
        p.relative_to(csrc_dir()).as_posix() for p in (csrc_dir() / "harness").glob("*.c")
    }
    assert set(sources) == on_disk


def _write(path: str) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        (folder / path).write_text("/* changed */\n", encoding="utf-8")

    return change


def _move(folder: Path) -> None:
    (folder / "arch" / "x86" / "x86.h").rename(folder / "x86.h")


CHANGES: dict[str, Callable[[Path], None]] = {
    "arch header": _write("arch/x86/tile.h"),
    "arch source": _write("arch/x86/dot.c"),
    "generic header": _write("quants.h"),
    "new file": _write("arch/x86/new.c"),
    "moved file": _move,
}


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_any_source_change_gives_a_new_library(csrc_copy: Path, name: str) -> None:
    before = library_name("cc", "avx2")
    CHANGES[name](csrc_copy)
    assert library_name("cc", "avx2") != before


def test_the_harness_does_not_change_the_library(csrc_copy: Path) -> None:
    before = library_name("cc", "portable")
    (csrc_copy / "harness" / "reference.c").write_text("/* changed */\n", encoding="utf-8")
    assert library_name("cc", "portable") == before
