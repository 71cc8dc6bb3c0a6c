"""How the node wires its parts:

* a node alone folds each event once (its master's state is the node's; the node used to
  apply every event a second time to a copy of its own);
* the worker acts on the download actions of the log itself (for its own node only);
* the API is given what it needs and imports nothing of the worker.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from exo.api.settings import ApiSettings
from exo.main import Node, NodeConfig
from exo.shared.models.model_cards import ModelCard
from exo.shared.tests.builders import NODE_B, model_card, node_info
from exo.shared.types.commands import DownloadActionKind
from exo.shared.types.events import DownloadActionRequested, NodeGatheredInfo

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_node_alone_folds_each_event_once(tmp_path: Path) -> None:
    node = Node(NodeConfig(data_dir=tmp_path, api=ApiSettings(port=0)))
    master = node.master
    assert master is not None
    await master.emit(NodeGatheredInfo(node_id=node.node_id, info=node_info()))
    await master.emit(NodeGatheredInfo(node_id=NODE_B, info=node_info("b")))
    assert node.state() is master.state  # one fold, not two
    assert node.state().last_event_applied_idx == 1
    assert node.worker.state is master.state


class _Downloads:
    def __init__(self) -> None:
        self.actions: list[tuple[DownloadActionKind, str]] = []

    def action(self, action: DownloadActionKind, card: ModelCard) -> None:
        self.actions.append((action, card.model_id))


async def test_the_worker_acts_on_its_own_download_actions(tmp_path: Path) -> None:
    node = Node(NodeConfig(data_dir=tmp_path, api=ApiSettings(port=0)))
    downloads = _Downloads()
    node.worker.downloads = downloads  # type: ignore[assignment]  # made in Worker.run
    master = node.master
    assert master is not None
    card = model_card()
    await master.emit(DownloadActionRequested(node_id=NODE_B, action="start", model_card=card))
    await master.emit(
        DownloadActionRequested(node_id=node.node_id, action="delete", model_card=card)
    )
    assert downloads.actions == [("delete", card.model_id)]


def test_the_api_imports_nothing_of_the_worker() -> None:
    code = (
        "import sys, exo.api.main, exo.api.management, exo.api.serving;"
        "print(sorted(m for m in sys.modules if m.startswith('exo.worker')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "[]"
