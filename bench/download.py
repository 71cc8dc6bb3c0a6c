"""Download throughput from the local stand-in hub: exo's shard download (huggingface_hub,
sha256 check, progress events) against a plain httpx stream of the same files, in the
same run; and the number of progress events the download adds to the log.

    python bench/download.py [--mb 1024] [--files 2]
"""

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import httpx2

from exo.shared.types.worker.downloads import DownloadCompleted, DownloadProgress
from exo.worker.download.cards import card_from_hub
from exo.worker.download.hub import HubSettings, shard_files
from exo.worker.download.shard_download import ShardDownload
from exo.worker.download.tests.hub_server import FakeHub, HubRepo, serve_hub

REPO = "bench-org/bench-model"
CONFIG = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
          "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 512}


def make_repo(total_mb: int, n_files: int) -> HubRepo:
    per_file = (total_mb << 20) // n_files
    block = os.urandom(1 << 20)
    files = {f"model-{i + 1:05d}-of-{n_files:05d}.safetensors":
             block * (per_file >> 20) + os.urandom(per_file % (1 << 20)) for i in range(n_files)}
    files["config.json"] = json.dumps(CONFIG).encode()
    return HubRepo(files=files)


def plain_httpx(hub: FakeHub, names: list[str], out: Path, lib: Any = httpx) -> float:
    """Seconds to stream every file to disk with httpx (no hashing, no cache layout);
    ``lib=httpx2`` for the fork huggingface_hub uses."""
    start = time.perf_counter()
    with lib.Client(timeout=60) as client:
        for name in names:
            url = f"{hub.url}/{REPO}/resolve/main/{name}"
            with client.stream("GET", url) as r, (out / name).open("wb") as f:
                for chunk in r.iter_bytes():
                    f.write(chunk)
    return time.perf_counter() - start


async def exo_download(settings: HubSettings) -> tuple[float, int]:
    card = card_from_hub(REPO, settings)
    events: list[DownloadProgress] = []

    async def report(progress: DownloadProgress) -> None:
        events.append(progress)

    start = time.perf_counter()
    outcome = await ShardDownload(card, 0, card.n_layers, settings).run(report)
    elapsed = time.perf_counter() - start
    assert isinstance(outcome, DownloadCompleted), outcome
    # The worker adds one "started" event and one final event around these.
    return elapsed, len(events) + 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=1024, help="total size of the weights")
    parser.add_argument("--files", type=int, default=2, help="number of weight files")
    args = parser.parse_args()
    hub = FakeHub()
    hub.repos[REPO] = make_repo(args.mb, args.files)
    names = sorted(hub.repos[REPO].files)
    total = sum(len(d) for d in hub.repos[REPO].files.values())
    with serve_hub(hub), tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "plain").mkdir()
        settings = HubSettings(cache_dir=root / "hf-cache", endpoint=hub.url)
        assert len(shard_files(card_from_hub(REPO, settings), 0, 2, settings)) == len(names)
        # Alternate the two (each twice, fresh each time) and keep the best of each.
        plain_runs: list[float] = []
        plain2_runs: list[float] = []
        exo_runs: list[float] = []
        events = 0
        for i in range(2):
            plain_runs.append(plain_httpx(hub, names, root / "plain"))
            plain2_runs.append(plain_httpx(hub, names, root / "plain", httpx2))
            run = HubSettings(cache_dir=root / f"hf-cache-{i}", endpoint=hub.url)
            seconds, events = asyncio.run(exo_download(run))
            exo_runs.append(seconds)
        plain_s, exo_s = min(plain_runs), min(exo_runs)
    mb = total / 1e6
    print(f"files: {len(names)}, {mb:.0f} MB from the local stand-in hub")
    plain2_s = min(plain2_runs)
    print(f"plain httpx stream:  {plain_s:7.2f} s  {mb / plain_s:8.1f} MB/s")
    print(f"plain httpx2 stream: {plain2_s:7.2f} s  {mb / plain2_s:8.1f} MB/s")
    print(f"exo shard download:  {exo_s:7.2f} s  {mb / exo_s:8.1f} MB/s  "
          f"(ratio {plain_s / exo_s:.2f}x of httpx, {plain2_s / exo_s:.2f}x of httpx2; "
          "includes the sha256 check)")
    print(f"progress events added to the log: {events} "
          f"(about {events * 1000 / max(mb, 1):.0f} per GB at this speed)")


if __name__ == "__main__":
    main()
