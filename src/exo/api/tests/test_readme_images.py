"""The README's image requests, run as written (bash, printf, base64, curl) against the real
HTTP API of a scripted node serving a vision card: each API accepts its image and the task
carries it decoded."""

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from exo.api.main import create_app
from exo.api.settings import ApiSettings
from exo.api.tests.scripted_node import ScriptedNode, ServedApp, small_card

README = Path(__file__).resolve().parents[4] / "README.md"
MODEL = "google/gemma-3-4b-it"

pytestmark = [
    pytest.mark.slow,  # runs bash and curl
    pytest.mark.skipif(shutil.which("curl") is None, reason="no curl"),
]


def readme_image_requests() -> list[str]:
    """Each example of the README's Images section as one shell command."""
    text = README.read_text()
    section = text[text.index("### Images") : text.index("### The dashboard")]
    found = re.findall(r"^    (printf .*?) \\\n\s+(\| curl .*)$", section, re.M)
    return [f"{first} {second}" for first, second in found]


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[ScriptedNode, ServedApp]]:
    node = ScriptedNode(cards=[small_card(MODEL).model_copy(update={"vision": True})])
    app = ServedApp(create_app(node, ApiSettings(port=0, placement_timeout_s=5.0)), node)
    app.start()
    yield node, app
    app.stop()


def test_one_request_per_api_and_each_works(
    served: tuple[ScriptedNode, ServedApp], tmp_path: Path
) -> None:
    node, app = served
    commands = readme_image_requests()
    paths = [re.search(r"127\.0\.0\.1:52415(\S+)", c) for c in commands]
    assert [m.group(1) for m in paths if m] == [
        "/v1/chat/completions", "/v1/responses", "/v1/messages", "/api/chat",
    ]  # fmt: skip
    Image.new("RGB", (300, 200), (200, 30, 30)).save(tmp_path / "cat.png")
    port = app.url.rsplit(":", 1)[1]
    for command in commands:
        local = command.replace("127.0.0.1:52415", f"127.0.0.1:{port}") + " -s -w '\\n%{http_code}'"
        done = subprocess.run(["bash", "-c", local], cwd=tmp_path, capture_output=True,
                              text=True, timeout=30, check=False)  # fmt: skip
        assert done.stdout.endswith("\n200"), (command, done.stdout, done.stderr)
        images = node.generations[-1].task_params.input[-1].images
        assert [(i.format, i.width, i.height) for i in images] == [("PNG", 300, 200)]
