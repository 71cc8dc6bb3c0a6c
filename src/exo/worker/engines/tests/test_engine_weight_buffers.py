"""Weight buffers of 2 MiB or more ask for huge pages (decode streams every weight each token;
on 4 KiB pages the prefetchers stop at every page boundary: Gemma 3's head ran 1.35x slower)."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from exo.modelgen.custom import Size, llama_gguf
from exo.worker.engines.file_rows import HUGE_PAGE, weight_buffer
from exo.worker.engines.gguf_reader import GGUFFile

_THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _advised_huge(t: torch.Tensor) -> bool:
    """Whether the mapping holding t's first byte carries the "hg" (MADV_HUGEPAGE) flag."""
    address = t.data_ptr()
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0] if line.split() else ""
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(v, 16) for v in head.split("-"))
            inside = lo <= address < hi
        elif inside and line.startswith("VmFlags:"):
            return "hg" in line.split()[1:]
    return False


needs_thp = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not _THP.exists() or "[never]" in _THP.read_text(),
    reason="transparent huge pages are not available here",
)


@needs_thp
def test_big_buffers_are_advised_to_use_huge_pages() -> None:
    big = weight_buffer(4, HUGE_PAGE)
    assert big.shape == (4, HUGE_PAGE) and big.dtype == torch.uint8
    big.fill_(7)
    assert _advised_huge(big)
    small = weight_buffer(4, 1024)
    assert small.shape == (4, 1024)


def test_a_view_keeps_the_buffer_alive() -> None:
    t = weight_buffer(8, HUGE_PAGE // 2)
    t.fill_(3)
    view = t[5:7]
    del t
    assert int(view.sum()) == 3 * 2 * (HUGE_PAGE // 2)


_READ_AND_CHECK = """
import sys
from pathlib import Path
from exo.worker.engines.gguf_reader import GGUFFile
from exo.worker.engines.tests.test_engine_weight_buffers import _advised_huge
f = GGUFFile(Path(sys.argv[1]))
info = f.tensors[sys.argv[2]]
raw = f.read_rows(sys.argv[2], 0, info.shape[0])
print("huge" if _advised_huge(raw) else "plain")
"""


@needs_thp
def test_a_big_tensor_read_from_a_gguf_file_lands_in_huge_page_memory(tmp_path: Path) -> None:
    """In a fresh process (in this one, memory numpy advised earlier may be reused by chance)."""
    path = llama_gguf(tmp_path / "m.gguf", "Q8_0", Size(hidden=512, ffn=4096, vocab=4096))
    f = GGUFFile(path)
    name = max(f.tensors, key=lambda n: f.tensors[n].n_bytes)
    assert f.tensors[name].n_bytes >= HUGE_PAGE and len(f.tensors[name].shape) == 2
    f.close()
    done = subprocess.run(
        [sys.executable, "-c", _READ_AND_CHECK, str(path), name],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "huge", done.stdout
