"""A GGUF model served by the stand-in hub, placed as a 2-node pipeline over loopback: each
node downloads only its shard's tensors (and the header), keeps a shard file, and the
instance answers."""

from pathlib import Path
from typing import Any

import httpx
import pytest

from exo.cluster.tests.nodes import node_group, wait_until
from exo.cluster.tests.test_cluster_nodes import ids_of, wait_agreed
from exo.modelgen.custom import Size, llama_gguf
from exo.worker.download.embedded import find_embedded_gguf
from exo.worker.download.tests.hub_server import FakeHub, serve_hub
from exo.worker.engines.gguf_reader import GGUFFile

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

REPO = "gen-org/Rand-GGUF"
FILE = "Rand-Q8_0.gguf"
MODEL = f"{REPO}:Q8_0"


async def test_each_node_downloads_only_its_shard_of_a_gguf_and_the_split_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    smol = find_embedded_gguf()
    assert smol is not None
    folder = tmp_path / "repo"
    folder.mkdir()
    size = Size(layers=4, hidden=128, ffn=256, heads=4, kv_heads=2, tied=True)
    llama_gguf(folder / FILE, "Q8_0", size, tokenizer=smol)  # tied: both ends hold the embedding
    hubs = [FakeHub(), FakeHub()]  # one per node: each counts what its node downloads
    for hub in hubs:
        hub.add_folder(REPO, folder, from_disk=True)
    with serve_hub(hubs[0]), serve_hub(hubs[1]):
        async with node_group(tmp_path / "cluster") as group:
            caches: dict[str, Path] = {}
            procs = []
            for i, name in enumerate(("n0", "n1")):
                caches[name] = tmp_path / f"cache-{name}"
                monkeypatch.setenv("HF_HUB_CACHE", str(caches[name]))  # read at start
                monkeypatch.setenv("HF_ENDPOINT", hubs[i].url)
                procs.append(group.start(name, [p.endpoint for p in procs]))
                await group.up(procs[-1])
            await wait_agreed(procs, set(await ids_of(*procs)))
            ids = dict(zip(("n0", "n1"), await ids_of(*procs), strict=True))
            async with httpx.AsyncClient(timeout=300) as http:
                added = await http.post(f"{procs[0].url}/models/add", json={"model": MODEL})
                assert added.status_code == 200, added.text
                for hub in hubs:  # what the card read is not part of any node's download
                    hub.requests.clear()
                r = await http.post(f"{procs[0].url}/place_instance",
                                    json={"model": MODEL, "min_nodes": 2})
                assert r.status_code == 200, r.text

                async def both_downloaded() -> bool:
                    state: dict[str, Any] = await procs[0].state()
                    kinds = [state["downloads"].get(ids[n], {}).get(MODEL, {}).get("kind")
                             for n in ids]
                    return kinds == ["DownloadCompleted", "DownloadCompleted"]

                await wait_until(both_downloaded, 180, "both nodes to download their shards")
                # (a node's API reads the header again for a card it lacks: not a download)
                downloaded = [hub.bytes_sent(REPO) for hub in hubs]
                state = await procs[0].state()
                reply = await http.post(f"{procs[1].url}/v1/chat/completions", json={
                    "model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 4, "temperature": 0,
                })
                assert reply.status_code == 200, reply.text
                assert reply.json()["choices"][0]["message"]["content"] is not None
    [instance] = state["instances"].values()
    shards = instance["shard_assignments"]["runner_to_shard"]
    ranges = {node: (shards[rid]["start_layer"], shards[rid]["end_layer"])
              for node, rid in instance["shard_assignments"]["node_to_runner"].items()}
    assert sorted(ranges.values())[0][0] == 0 and len(ranges) == 2
    whole = GGUFFile(folder / FILE)
    for i, (name, node_id) in enumerate(ids.items()):
        start, end = ranges[node_id]
        done = state["downloads"][node_id][MODEL]
        assert (done["start_layer"], done["end_layer"]) == (start, end)
        assert not list(caches[name].rglob("snapshots/*/*.gguf"))  # never the whole file
        [kept] = list(caches[name].rglob(f"exo-shards/*/*/layers-{start}-{end}/{FILE}"))
        held = GGUFFile(kept)
        blocks = {int(n.split(".")[1]) for n in held.tensors if n.startswith("blk.")}
        assert blocks == set(range(start, end))
        assert "token_embd.weight" in held.tensors and "output.weight" not in held.tensors
        assert ("output_norm.weight" in held.tensors) == (end == 4)
        share = sum(t.n_bytes for t in held.tensors.values())
        header = min(t.offset for t in whole.tensors.values())
        sent = downloaded[i]
        assert sent <= (share + header) * 1.05, (name, sent, share, header)
        held.close()
    whole.close()
