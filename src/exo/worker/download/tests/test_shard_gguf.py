"""Shard-only GGUF downloads against the stand-in hub (real HTTP on loopback): a node
fetches the header and its tensors' byte ranges, keeps a valid GGUF of just those tensors,
resumes a cut, reuses what it holds, falls back when the hub ignores Range, and refuses a
header that lies."""

import shutil
import threading
from pathlib import Path

import pytest
import torch
from loguru import logger

from exo.modelgen.custom import Size, llama_gguf
from exo.shared.models.model_cards import ModelCard
from exo.shared.types.worker.downloads import DownloadCompleted, DownloadFailed, DownloadOngoing
from exo.worker.download.cards import card_from_hub
from exo.worker.download.gguf_index import kv_u32, read_gguf_index, shard_layout
from exo.worker.download.hub import HubSettings, delete_hub_model, locate_hub_model
from exo.worker.download.model_dirs import scan_models_dir
from exo.worker.download.resumable import PARTIAL_SUFFIX
from exo.worker.download.shard_download import ShardDownload
from exo.worker.download.shard_gguf import GGUFShardFetch, shard_path, wanted
from exo.worker.download.tests.hub_models import GGUF_REPO
from exo.worker.download.tests.hub_server import FakeHub
from exo.worker.engines.gguf_loader import load_gguf_shard
from exo.worker.engines.gguf_reader import GGUFFile
from exo.worker.engines.llama import LlamaModel, StepInputs

FILE = "TinyLlama-Q8_0.gguf"


def _card(settings: HubSettings) -> ModelCard:
    return card_from_hub(f"{GGUF_REPO}:Q8_0", settings)


def _fetch(card: ModelCard, settings: HubSettings, start: int, end: int) -> Path:
    fetch = GGUFShardFetch(card, start, end, settings, lambda _: None, threading.Event())
    return fetch.run()


def _data_gets(hub: FakeHub) -> list[tuple[int, int]]:
    """(start, bytes sent) of every GET of the GGUF file after its header's first request."""
    return [(r.range_start, r.sent) for r in hub.requests
            if r.method == "GET" and r.file == FILE and r.range_start > 0]


def _greedy(models: list[LlamaModel], prompt: list[int], n: int) -> list[int]:
    caches = [m.new_cache(1, len(prompt) + n + 1) for m in models]
    tokens, out = torch.tensor([prompt]), list[int]()
    with torch.inference_mode():
        for i in range(n):
            step = StepInputs.single(0, 0, len(prompt)) if i == 0 else StepInputs.single(
                0, len(prompt) + i - 1, 1)
            h = models[0].embed(tokens)
            for m, cache in zip(models, caches, strict=True):
                h = m.forward_layers(h, step, cache)
            out.append(int(models[-1].head(h)[0, -1].argmax()))
            tokens = torch.tensor([[out[-1]]])
    return out


def test_each_stage_holds_exactly_its_tensors_and_decodes_as_the_full_file(
    hub: FakeHub, settings: HubSettings, tmp_path: Path
) -> None:
    card = _card(settings)
    full_path = tmp_path / FILE
    full_path.write_bytes(hub.repos[GGUF_REPO].files[FILE])
    full = GGUFFile(full_path)
    paths = [_fetch(card, settings, 0, 1), _fetch(card, settings, 1, 3)]
    for (start, end), path in zip([(0, 1), (1, 3)], paths, strict=True):
        f = GGUFFile(path)
        expected = {n for n in full.tensors if wanted(n, start, end, 3, tied=False)}
        assert set(f.tensors) == expected
        assert all(f.raw(n).tobytes() == full.raw(n).tobytes() for n in expected)
        meta = f.metadata
        assert (meta["exo.shard.start_layer"], meta["exo.shard.end_layer"]) == (start, end)
        assert meta["exo.shard.repo"] == GGUF_REPO and meta["exo.shard.file"] == FILE
        assert meta["exo.shard.revision"] == card.hub.revision if card.hub else False
        assert meta["llama.block_count"] == 3  # the model's metadata, unchanged
        f.close()
    assert "token_embd.weight" not in GGUFFile(paths[1]).tensors
    assert "output.weight" not in GGUFFile(paths[0]).tensors
    whole = LlamaModel(load_gguf_shard(full_path, 0, 3), weight_format="dense")
    stages = [LlamaModel(load_gguf_shard(paths[0], 0, 1), weight_format="dense"),
              LlamaModel(load_gguf_shard(paths[1], 1, 3), weight_format="dense")]
    prompt = [1, 17, 42, 99, 5]
    assert _greedy(stages, prompt, 6) == _greedy([whole], prompt, 6)


def test_a_stage_downloads_its_share_and_the_header_only(
    hub: FakeHub, settings: HubSettings
) -> None:
    card = _card(settings)
    hub.requests.clear()
    path = _fetch(card, settings, 1, 2)
    share = sum(t.n_bytes for t in GGUFFile(path).tensors.values())
    header = GGUFFile(path).tensors["blk.1.attn_norm.weight"].offset  # past the header
    assert hub.bytes_sent(GGUF_REPO) <= (share + header) * 1.05
    assert hub.bytes_sent(GGUF_REPO) < len(hub.repos[GGUF_REPO].files[FILE]) * 0.5


def test_a_cut_mid_range_resumes_from_the_bytes_held(
    hub: FakeHub, settings: HubSettings
) -> None:
    card = _card(settings)
    reference = _fetch(card, settings, 0, 2).read_bytes()
    shard_path(settings.cache_dir, card.hub, 0, 2).unlink() if card.hub else None
    hub.requests.clear()
    hub.cut_ranged_once.add(FILE)
    assert _fetch(card, settings, 0, 2).read_bytes() == reference
    gets = _data_gets(hub)
    cut = next(i for i, (_, sent) in enumerate(gets) if sent and gets[i + 1][0] > gets[i][0])
    assert gets[cut + 1][0] == gets[cut][0] + gets[cut][1]  # continued at the byte it had


def test_a_restart_continues_the_partial_file(hub: FakeHub, settings: HubSettings) -> None:
    card = _card(settings)
    assert card.hub is not None
    final = _fetch(card, settings, 0, 2)
    reference = final.read_bytes()
    held = len(reference) * 2 // 3
    final.unlink()
    partial = final.with_name(final.name + PARTIAL_SUFFIX)
    partial.write_bytes(reference[:held])
    hub.requests.clear()
    assert _fetch(card, settings, 0, 2).read_bytes() == reference
    assert not partial.exists()
    header_bytes = sum(r.sent for r in hub.requests if r.range_start == 0)
    assert hub.bytes_sent(GGUF_REPO) - header_bytes <= len(reference) - held


def test_the_same_shard_is_reused_and_another_fetches_only_what_it_lacks(
    hub: FakeHub, settings: HubSettings
) -> None:
    card = _card(settings)
    first = _fetch(card, settings, 0, 2)
    assert locate_hub_model(card, settings.cache_dir, (0, 2)) == first
    assert locate_hub_model(card, settings.cache_dir, (1, 2)) == first  # a wider shard holds it
    assert locate_hub_model(card, settings.cache_dir, (1, 3)) is None
    hub.requests.clear()
    assert _fetch(card, settings, 0, 2) == first
    assert hub.requests == []
    second = _fetch(card, settings, 1, 3)
    f = GGUFFile(second)
    only_new = [t for n, t in f.tensors.items() if n.startswith("blk.2.") or n.startswith("output")]
    header_bytes = sum(r.sent for r in hub.requests if r.range_start == 0)
    assert hub.bytes_sent(GGUF_REPO) - header_bytes == sum(t.n_bytes for t in only_new)
    reused = GGUFFile(first).raw("blk.1.ffn_down.weight").tobytes()
    assert f.raw("blk.1.ffn_down.weight").tobytes() == reused


def test_a_header_that_lies_is_refused(hub: FakeHub, settings: HubSettings) -> None:
    card = _card(settings)
    assert card.hub is not None
    repo = hub.repos[GGUF_REPO]
    repo.sha = card.hub.revision
    data = repo.files[FILE]
    repo.files[FILE] = data[: len(data) // 2]  # its header places tensors past its end
    files = [f.model_copy(update={"size": len(data) // 2}) for f in card.hub.files]
    card = card.model_copy(update={"hub": card.hub.model_copy(update={"files": files})})
    with pytest.raises(Exception, match="past the file's end") as raised:
        _fetch(card, settings, 0, 1)
    assert getattr(raised.value, "status", None) == 422
    assert not shard_path(settings.cache_dir, card.hub, 0, 1).exists() if card.hub else False


@pytest.mark.anyio
async def test_a_hub_that_ignores_range_gets_a_whole_file_download(
    hub: FakeHub, settings: HubSettings
) -> None:
    card = _card(settings)
    hub.ignore_range = True
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="WARNING", format="{message}")
    try:

        async def report(_: object) -> None:
            pass

        outcome = await ShardDownload(card, 1, 3, settings, interval_s=0.05).run(report)
    finally:
        logger.remove(sink)
    assert not isinstance(outcome, DownloadFailed), outcome
    assert isinstance(outcome, DownloadCompleted) and outcome.path.endswith(FILE)
    assert Path(outcome.path).read_bytes() == hub.repos[GGUF_REPO].files[FILE]
    assert len([line for line in lines if "ignores Range" in line]) == 1
    assert locate_hub_model(card, settings.cache_dir, (1, 3)) == Path(outcome.path)


def test_the_model_folder_scan_does_not_take_a_shard_for_a_broken_model(
    hub: FakeHub, settings: HubSettings, tmp_path: Path
) -> None:
    card = _card(settings)
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(_fetch(card, settings, 1, 3), models / "TinyLlama-shard-Q8_0.gguf")
    (models / FILE).write_bytes(hub.repos[GGUF_REPO].files[FILE])
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="WARNING", format="{message}")
    try:
        cards = scan_models_dir(models)
    finally:
        logger.remove(sink)
    assert [c.model_id for c in cards] == ["TinyLlama-Q8_0"]
    assert lines == []


SPLIT_REPO = "tiny-org/TinySplit-GGUF"
PARTS = ("TinySplit-Q8_0-00001-of-00002.gguf", "TinySplit-Q8_0-00002-of-00002.gguf")


def _write_split(source: bytes, folder: Path) -> None:
    """The file as a 2-part split GGUF (as llama.cpp's gguf-split lays it out): the
    embedding and layer 0 in part 1, the rest in part 2, each part a GGUF of its own."""
    index = read_gguf_index(source)
    names = [t.name for t in index.tensors]
    cut = names.index("blk.1.attn_norm.weight")
    groups = [list(index.tensors[:cut]), list(index.tensors[cut:])]
    folder.mkdir(parents=True, exist_ok=True)
    for i, group in enumerate(groups):
        extra = [kv_u32("split.no", i), kv_u32("split.count", 2)]
        header, offsets = shard_layout(index, group, extra)
        out = bytearray(header)
        for t, at in zip(group, offsets, strict=True):
            out += b"\0" * (at - len(out))
            begin = index.data_start + t.offset
            out += source[begin : begin + t.n_bytes]
        (folder / PARTS[i]).write_bytes(bytes(out))


def test_a_split_gguf_fetches_only_the_parts_holding_the_shard(
    hub: FakeHub, settings: HubSettings, tmp_path: Path
) -> None:
    source = hub.repos[GGUF_REPO].files[FILE]
    _write_split(source, tmp_path / "split")
    hub.add_folder(SPLIT_REPO, tmp_path / "split", from_disk=True)
    card = card_from_hub(f"{SPLIT_REPO}:Q8_0", settings)
    assert card.hub is not None and [f.path for f in card.hub.files] == list(PARTS)
    first_data = read_gguf_index((tmp_path / "split" / PARTS[0]).read_bytes()).data_start
    hub.requests.clear()
    path = _fetch(card, settings, 1, 3)
    part1 = [r for r in hub.requests if r.file == PARTS[0] and r.method == "GET"]
    assert all(r.range_start + r.sent <= first_data for r in part1)  # its header at most
    full_path = tmp_path / FILE
    full_path.write_bytes(source)
    full, shard = GGUFFile(full_path), GGUFFile(path)
    assert set(shard.tensors) == {n for n in full.tensors if wanted(n, 1, 3, 3, tied=False)}
    assert all(shard.raw(n).tobytes() == full.raw(n).tobytes() for n in shard.tensors)
    assert not any(k.startswith("split.") for k in shard.metadata)
    whole = _fetch(card, settings, 0, 3)  # every layer: the parts joined into one file
    stages = [LlamaModel(load_gguf_shard(whole, 0, 3), weight_format="dense")]
    reference = [LlamaModel(load_gguf_shard(full_path, 0, 3), weight_format="dense")]
    assert _greedy(stages, [1, 5, 9], 4) == _greedy(reference, [1, 5, 9], 4)


def test_deleting_a_model_frees_its_shard_files(hub: FakeHub, settings: HubSettings) -> None:
    card = _card(settings)
    path = _fetch(card, settings, 1, 3)
    assert delete_hub_model(card, settings.cache_dir)
    assert not path.exists() and locate_hub_model(card, settings.cache_dir, (1, 3)) is None


@pytest.mark.anyio
async def test_a_shard_download_reports_its_range_and_its_file_s_bytes(
    hub: FakeHub, settings: HubSettings
) -> None:
    card = _card(settings)
    hub.bytes_per_s = 2e6
    reports: list[object] = []

    async def report(p: object) -> None:
        reports.append(p)

    download = ShardDownload(card, 1, 3, settings, interval_s=0.02)
    outcome = await download.run(report)
    assert isinstance(outcome, DownloadCompleted)
    assert (outcome.start_layer, outcome.end_layer) == (1, 3)
    ongoing = [p for p in reports if isinstance(p, DownloadOngoing)]
    assert ongoing and all((p.start_layer, p.end_layer) == (1, 3) for p in ongoing)
    assert ongoing[-1].total_bytes == Path(outcome.path).stat().st_size
    assert download.done_bytes == download.total_bytes  # held, fetched and copied: all of it


def test_a_tied_head_puts_the_embedding_in_the_last_stage_too(
    hub: FakeHub, settings: HubSettings, tmp_path: Path
) -> None:
    folder = tmp_path / "tied"
    folder.mkdir()
    full_path = llama_gguf(folder / "Tied-Q8_0.gguf", "Q8_0", Size(layers=3, tied=True))
    hub.add_folder("gen-org/Tied-GGUF", folder, from_disk=True)
    card = card_from_hub("gen-org/Tied-GGUF:Q8_0", settings)
    first, last = _fetch(card, settings, 0, 2), _fetch(card, settings, 2, 3)
    tail = GGUFFile(last).tensors
    assert "token_embd.weight" in tail and "output.weight" not in tail
    assert {n for n in tail if n.startswith("blk.")} == {n for n in GGUFFile(full_path).tensors
                                                         if n.startswith("blk.2.")}
    stages = [LlamaModel(load_gguf_shard(first, 0, 2), weight_format="dense"),
              LlamaModel(load_gguf_shard(last, 2, 3), weight_format="dense")]
    whole = LlamaModel(load_gguf_shard(full_path, 0, 3), weight_format="dense")
    assert _greedy(stages, [1, 7, 300], 5) == _greedy([whole], [1, 7, 300], 5)
