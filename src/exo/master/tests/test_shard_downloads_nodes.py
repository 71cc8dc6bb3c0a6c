"""A hub model placed as a 2-node pipeline: each node downloads only its shard's files."""

from pathlib import Path
from typing import Any

import httpx
import pytest

from exo.cluster.tests.nodes import node_group, wait_until
from exo.cluster.tests.test_cluster_nodes import ids_of, wait_agreed
from exo.worker.download.tests.hub_models import SAFETENSORS_REPO, write_sharded_llama
from exo.worker.download.tests.hub_server import FakeHub, serve_hub

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

FILE1 = "model-00001-of-00002.safetensors"
FILE2 = "model-00002-of-00002.safetensors"


async def test_each_node_of_a_pipeline_downloads_only_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub = FakeHub()
    hub.add_folder(SAFETENSORS_REPO, write_sharded_llama(tmp_path / "model"))
    with serve_hub(hub):
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        async with node_group(tmp_path / "cluster") as group:
            caches: dict[str, Path] = {}
            procs = []
            for name in ("n0", "n1"):
                caches[name] = tmp_path / f"cache-{name}"
                monkeypatch.setenv("HF_HUB_CACHE", str(caches[name]))  # read by the node at start
                procs.append(group.start(name, [p.endpoint for p in procs]))
                await group.up(procs[-1])
            await wait_agreed(procs, set(await ids_of(*procs)))
            async with httpx.AsyncClient(timeout=60) as http:
                r = await http.post(f"{procs[0].url}/place_instance",
                                    json={"model": SAFETENSORS_REPO, "min_nodes": 2})
                assert r.status_code == 200, r.text
            ids = dict(zip(("n0", "n1"), await ids_of(*procs), strict=True))

            async def both_downloaded() -> bool:
                state: dict[str, Any] = await procs[0].state()
                done = [state["downloads"].get(ids[n], {}).get(SAFETENSORS_REPO, {}).get("kind")
                        for n in ids]
                return done == ["DownloadCompleted", "DownloadCompleted"]

            await wait_until(both_downloaded, 120, "both nodes to download their shards")
            state = await procs[0].state()
            [instance] = state["instances"].values()
            shards = instance["shard_assignments"]["runner_to_shard"]
            ranges = {node: (shards[rid]["start_layer"], shards[rid]["end_layer"])
                      for node, rid in instance["shard_assignments"]["node_to_runner"].items()}
    # 3 layers: layer 0 in file 1, layer 1 across both, layer 2 (and the head) in file 2.
    expected = {(0, 1): {FILE1}, (0, 2): {FILE1, FILE2}, (1, 3): {FILE1, FILE2}, (2, 3): {FILE2}}
    for name, node_id in ids.items():
        have = {p.name for p in caches[name].rglob("*.safetensors")}
        assert have == expected[ranges[node_id]], (name, ranges[node_id], have)
    assert any(expected[r] != {FILE1, FILE2} for r in ranges.values())
