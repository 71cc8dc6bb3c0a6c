"""A model file's declared context never sizes memory by itself (issue #20, fault 7).

A GGUF declaring `context_length = 2^31 - 1` once made the runner build rotary tables for every
declared position (12.6 GB RSS within a minute). The engine sizes its tables by the context it
serves (`EXO_MAX_CONTEXT_TOKENS`, as placement assumed); cards refuse a declared context above
2^24, while real models' 128k-1M contexts stay offered.
"""

import gc
import struct
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from exo.modelgen.custom import llama_gguf
from exo.tests.node_process import free_port
from exo.worker.download.cards import card_from_hub
from exo.worker.download.hub import DownloadError, HubSettings
from exo.worker.download.local import card_from_path
from exo.worker.download.tests.hub_server import FakeHub, HubRepo, serve_hub
from exo.worker.engines.config import MAX_CONTEXT_LENGTH
from exo.worker.engines.engine import load_engine
from exo.worker.engines.sampling import SamplingParams

_UINT32 = 4  # GGUF metadata value type


def with_context_length(source: Path, target: Path, context_length: int) -> Path:
    """A copy of the llama GGUF `source` whose `llama.context_length` (a uint32) is changed."""
    data = bytearray(source.read_bytes())
    key = b"llama.context_length"
    at = data.index(struct.pack("<Q", len(key)) + key) + 8 + len(key)
    assert struct.unpack_from("<I", data, at)[0] == _UINT32
    struct.pack_into("<I", data, at + 4, context_length)
    target.write_bytes(bytes(data))
    return target


def _rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def _answer(path: Path, cache: Path) -> tuple[list[int], int]:
    """Greedy tokens of a short prompt, and the RSS growth of loading and running the model."""
    before = _rss()
    engine = load_engine(path, cache_dir=cache)
    tokens = list(engine.generate([1, 42, 7, 99], SamplingParams(temperature=0.0, max_tokens=6)))
    grown = _rss() - before
    del engine
    return tokens, grown


def test_a_huge_declared_context_loads_small_and_answers(
    tmp_path: Path, gguf_path: Path, tokenizer_cache: Path
) -> None:
    normal = llama_gguf(tmp_path / "normal.gguf", "Q8_0", tokenizer=gguf_path)
    huge = with_context_length(normal, tmp_path / "huge.gguf", 2**31 - 1)
    expected, _ = _answer(normal, tokenizer_cache)  # (also warms the kernels and tokenizer)
    tokens, grown = _answer(huge, tokenizer_cache)
    assert tokens == expected and len(tokens) > 0
    # the weights and tokenizer are ~30 MB; a table for every declared position would be TBs
    assert grown < 256 * 2**20, f"RSS grew by {grown / 2**20:.0f} MiB"


def test_cards_refuse_a_declared_context_above_2_to_the_24(tmp_path: Path) -> None:
    source = llama_gguf(tmp_path / "m.gguf", "Q8_0")
    real = card_from_path(with_context_length(source, tmp_path / "1m.gguf", 1_048_576))
    assert real.context_length == 1_048_576  # real long-context models stay offered
    edge = card_from_path(with_context_length(source, tmp_path / "edge.gguf", MAX_CONTEXT_LENGTH))
    assert edge.context_length == 2**24
    hostile = with_context_length(source, tmp_path / "hostile.gguf", 2**24 + 1)
    with pytest.raises(ValueError, match=r"declares a context of 16777217 tokens.*2\^24"):
        card_from_path(hostile)


def test_hub_cards_refuse_a_declared_context_above_2_to_the_24(tmp_path: Path) -> None:
    source = llama_gguf(tmp_path / "m.gguf", "Q8_0")
    hub = FakeHub()
    for repo, context in (("org/long-GGUF", 1_048_576), ("org/hostile-GGUF", 2**24 + 1)):
        data = with_context_length(source, tmp_path / "x.gguf", context).read_bytes()
        hub.repos[repo] = HubRepo(files={"model-Q8_0.gguf": data})
    with serve_hub(hub):
        settings = HubSettings(cache_dir=tmp_path / "hf-cache", endpoint=hub.url)
        assert card_from_hub("org/long-GGUF:Q8_0", settings).context_length == 1_048_576
        with pytest.raises(DownloadError, match=r"org/hostile-GGUF: .*16777217 tokens") as refused:
            card_from_hub("org/hostile-GGUF:Q8_0", settings)
    assert refused.value.status == 400


@pytest.mark.slow
def test_a_node_refuses_such_a_file_with_one_clear_line(tmp_path: Path) -> None:
    hostile = with_context_length(
        llama_gguf(tmp_path / "m.gguf", "Q8_0"), tmp_path / "hostile.gguf", 2**24 + 1
    )
    cmd = [sys.executable, "-m", "exo.cli", "--api-port", str(free_port()), "--threads", "1",
           "--discovery-interface", "none", "--data-dir", str(tmp_path / "data"),
           "--model", str(hostile)]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "declares a context of 16777217 tokens" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
