"""--memory-limit makes one machine act as a small one: a model that no node may hold
alone, nor two together, is placed over three loopback nodes and answers like one node."""

from pathlib import Path

import httpx
import openai
import pytest

from exo.cluster.tests.nodes import node_group
from exo.cluster.tests.test_cluster_models import MODEL, QUESTION, serving_instance
from exo.cluster.tests.test_cluster_nodes import ids_of, wait_agreed
from exo.tests.node_process import running_node

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

# SmolLM2-135M (placement's estimate: 92 MiB of Q4_1 weights, 29 MiB of them the tied
# embedding that the first and the last runner both hold, a float16 KV cache of 360 MiB for 8
# requests of 2048 tokens, 256 MiB of runtime per runner): one node needs 708 MiB, each of
# two 496 MiB, each of three at most 426 MiB.
LIMIT = "450MiB"


def _greedy(url: str) -> str:
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=300)
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": QUESTION}], temperature=0,
        max_tokens=12,
    )
    return reply.choices[0].message.content or ""


async def test_a_memory_limit_forces_a_model_over_three_nodes_with_the_same_answer(
    tmp_path: Path,
) -> None:
    (tmp_path / "single").mkdir()
    with running_node(tmp_path / "single") as single:
        expected = _greedy(single.url)
    assert expected.strip()
    async with node_group(tmp_path / "cluster") as group:
        first = group.start("n0", extra=["--memory-limit", LIMIT])
        await group.up(first)
        procs = [first]
        for i in (1, 2):
            procs.append(group.start(f"n{i}", [p.endpoint for p in procs],
                                     extra=["--memory-limit", LIMIT]))
        await group.up(*procs[1:])
        await wait_agreed(procs, set(await ids_of(*procs)))
        async with httpx.AsyncClient(timeout=60) as http:
            r = await http.post(f"{first.url}/place_instance", json={"model": MODEL})
            assert r.status_code == 200, r.text
            assert r.json()["node_count"] == 3, r.text
            limit_bytes = 450 << 20
            assert all(v <= limit_bytes for v in r.json()["memory_per_node"].values())
        await serving_instance(procs, 300, sharding="pipeline", world=3)
        assert _greedy(procs[1].url) == expected
