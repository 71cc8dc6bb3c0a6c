"""CLI faults a user hits: clear messages and a non-zero exit, never a node left running
in a bad state or a path into some library's source."""

import subprocess
import sys
from pathlib import Path

import pytest

from exo.cli import build_parser
from exo.tests.node_process import free_port, running_node


def _run_cli(tmp_path: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "exo.cli", "--api-port", str(free_port()), "--threads", "1",
           "--discovery-interface", "none", *args]
    if "--data-dir" not in args:
        cmd += ["--data-dir", str(tmp_path / "data")]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("level", ["debug", "Info", "WARNING", "error"])
def test_log_level_is_case_insensitive(level: str) -> None:
    assert build_parser().parse_args(["--log-level", level]).log_level == level.upper()


@pytest.mark.slow
def test_a_bad_log_level_is_refused_clearly(tmp_path: Path) -> None:
    result = _run_cli(tmp_path, "--log-level", "loud")
    assert result.returncode != 0
    assert "--log-level" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("peer", ["garbage", "tcp/", "tcp/127.0.0.1", "tcp/127.0.0.1:99999",
                                  "http://127.0.0.1:7447"])
def test_a_garbage_peer_is_refused_clearly(tmp_path: Path, peer: str) -> None:
    result = _run_cli(tmp_path, "--model", "none", "--peer", peer)
    assert result.returncode != 0
    assert f"--peer {peer!r}" in result.stderr, result.stderr
    assert "tcp/192.168.1.7:7447" in result.stderr  # an example of what is expected
    assert ".rs" not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_garbage_listen_endpoint_is_refused_clearly(tmp_path: Path) -> None:
    result = _run_cli(tmp_path, "--model", "none", "--listen", "nonsense")
    assert result.returncode != 0
    assert "--listen 'nonsense'" in result.stderr, result.stderr


@pytest.mark.slow
def test_an_unknown_model_exits_non_zero_with_a_clear_error(tmp_path: Path) -> None:
    result = _run_cli(tmp_path, "--model", "nosuchmodel")
    assert result.returncode != 0
    assert "unknown model 'nosuchmodel'" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_second_node_on_the_same_data_dir_exits_naming_the_first(tmp_path: Path) -> None:
    with running_node(tmp_path, "--model", "none", wait_ready=False) as first:
        result = _run_cli(tmp_path, "--model", "none", "--data-dir", str(first.data_dir))
        assert result.returncode != 0
        assert f"pid {first.process.pid}" in result.stderr, result.stderr
        assert str(first.data_dir) in result.stderr
        assert "Traceback" not in result.stderr
        assert first.process.poll() is None  # the first node runs on, untouched
        assert first.get("/health").status_code == 200
