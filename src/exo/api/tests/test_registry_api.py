"""The API resolves models through the node's one registry: a model another node placed
(its card is in the state) is served here without asking the hub, and a hub name goes to
the fetcher the node gave the registry (the API has no hub code of its own)."""

import httpx

from exo.api.main import create_app
from exo.api.settings import ApiSettings
from exo.api.tests.scripted_node import ScriptedNode, ServedApp
from exo.shared.models.model_cards import ModelCard, ModelId
from exo.shared.models.registry import CardUnavailable, ModelRegistry
from exo.shared.tests.builders import INSTANCE_1, NODE_B, RUNNER_B1, model_card, pipeline_instance

REMOTE = ModelId("other-org/placed-elsewhere")


class _Hub:
    def __init__(self) -> None:
        self.asked: list[str] = []

    def fetch(self, name: str) -> ModelCard:
        self.asked.append(name)
        if name.startswith("gated/"):
            raise CardUnavailable(f"{name} is gated", 403)
        return model_card(ModelId(name))


def _serve(node: ScriptedNode, hub: _Hub) -> ServedApp:
    registry = ModelRegistry(node.model_cards(), fetch=hub.fetch, is_hub_name=lambda n: "/" in n)
    served = ServedApp(create_app(node, ApiSettings(port=0, placement_timeout_s=5.0), registry),
                       node)
    served.start()
    return served


def test_a_model_placed_elsewhere_is_known_without_the_hub(node: ScriptedNode) -> None:
    hub = _Hub()
    instance = pipeline_instance(INSTANCE_1, [(NODE_B, RUNNER_B1)], card=model_card(REMOTE))
    state = node.state()
    node.set_state(state.model_copy(update={"instances": {INSTANCE_1: instance}}))
    served = _serve(node, hub)
    try:
        r = httpx.get(served.url + "/instance/previews", params={"model": REMOTE}, timeout=10)
        assert r.status_code == 200, r.text
        assert r.json()["model"] == REMOTE
        assert hub.asked == []
    finally:
        served.stop()


def test_hub_names_go_to_the_registrys_fetcher(node: ScriptedNode) -> None:
    hub = _Hub()
    served = _serve(node, hub)
    try:
        added = httpx.post(served.url + "/models/add", json={"model": "new-org/new-model"},
                           timeout=10)
        assert added.status_code == 200, added.text
        gated = httpx.post(served.url + "/models/add", json={"model": "gated/model"},
                           timeout=10)
        assert gated.status_code == 403 and "gated" in gated.json()["detail"]
        assert hub.asked == ["new-org/new-model", "gated/model"]
        models = {m["model_id"] for m in httpx.get(served.url + "/models", timeout=10).json()}
        assert "new-org/new-model" in models
    finally:
        served.stop()
