"""The one loader (`engine.load_model`) for every shard kind, and the family registry."""

import json
import struct
import threading
from pathlib import Path

import pytest
import torch
from torch import Tensor

from exo.modelgen.custom import llama_gguf
from exo.worker.download.local import card_from_path
from exo.worker.engines.engine import Shard, load_engine, load_model
from exo.worker.engines.models.base import ShardModel, StepInputs
from exo.worker.engines.models.dense import DENSE, DenseModel
from exo.worker.engines.models.registry import (
    FAMILIES,
    family_for_gguf,
    family_for_hf,
    supported_gguf_architectures,
)
from exo.worker.engines.safetensors_loader import hf_config
from exo.worker.engines.weights import TensorParallel

from .test_engine_tensor_parallel import ThreadedAllReduce

PROMPT = [5, 9, 33, 70, 101, 12]
DENSE_GGUF = "llama, mistral, qwen2, qwen3, gemma3, phi3"


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return llama_gguf(tmp_path_factory.mktemp("loader") / "m.gguf", "Q8_0")


def _whole(model: ShardModel) -> Tensor:
    with torch.inference_mode():
        step = StepInputs.single(0, 0, len(PROMPT))
        return model.forward(torch.tensor([PROMPT]), step, model.new_cache(1, 16))


def test_a_pipeline_split_through_the_loader_equals_the_whole_model(
    model_file: Path, tmp_path: Path
) -> None:
    config, whole = load_model(model_file, cache_dir=tmp_path)
    assert isinstance(whole, DenseModel) and (whole.start_layer, whole.end_layer) == (0, 2)
    _, first = load_model(model_file, Shard(0, 1), cache_dir=tmp_path)
    _, second = load_model(model_file, Shard(1, 2), cache_dir=tmp_path)
    assert (first.end_layer, second.start_layer) == (1, 1)
    step = StepInputs.single(0, 0, len(PROMPT))
    with torch.inference_mode():
        hidden = first.forward_layers(first.embed(torch.tensor([PROMPT])), step,
                                      first.new_cache(1, 16))  # fmt: skip
        hidden = second.forward_layers(hidden, step, second.new_cache(1, 16))
        split = second.head(hidden[:, -1])
    assert config.n_layers == 2
    assert torch.equal(split, _whole(whole))


def test_tensor_parallel_ranks_through_the_loader_equal_the_whole_model(
    model_file: Path, tmp_path: Path
) -> None:
    _, whole = load_model(model_file, cache_dir=tmp_path)
    expected = _whole(whole)
    reduce = ThreadedAllReduce(2)
    results: list[Tensor | None] = [None, None]
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        try:
            shard = Shard(tensor_parallel=TensorParallel(rank, 2))
            _, model = load_model(
                model_file, shard, all_reduce=reduce.for_rank(rank), cache_dir=tmp_path
            )
            results[rank] = _whole(model)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    for got in results:
        assert got is not None
        torch.testing.assert_close(got, expected, atol=2e-2, rtol=0.0)


def _with_architecture(source: Path, target: Path, arch: bytes) -> Path:
    """A copy of a llama GGUF whose `general.architecture` reads `arch` (5 bytes, as "llama")."""
    data = bytearray(source.read_bytes())
    key = b"general.architecture"
    at = data.index(struct.pack("<Q", len(key)) + key) + 8 + len(key) + 4  # (value type)
    assert struct.unpack_from("<Q", data, at)[0] == len(arch) == 5
    data[at + 8 : at + 13] = arch
    target.write_bytes(bytes(data))
    return target


def test_an_unknown_architecture_is_refused_naming_it_and_the_supported_ones(
    model_file: Path, tmp_path: Path
) -> None:
    mamba = _with_architecture(model_file, tmp_path / "mamba.gguf", b"mamba")
    supported = ", ".join(supported_gguf_architectures())  # the dense ones, then the MoE ones
    assert supported.startswith(DENSE_GGUF)
    message = (
        rf"architecture 'mamba' is not supported \(supported GGUF architectures: {supported}\)"
    )
    with pytest.raises(ValueError, match=message):
        load_engine(mamba, cache_dir=tmp_path)
    with pytest.raises(ValueError, match=message):
        card_from_path(mamba)
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(ValueError, match=r"model_type 'mamba' is not supported \(.*gemma3_text"):
        hf_config(folder)


def test_the_registry_names_each_architecture_once() -> None:
    gguf = [a for f in FAMILIES for a in f.gguf_architectures]
    hf = [t for f in FAMILIES for t in f.hf_model_types]
    assert len(gguf) == len(set(gguf)) and len(hf) == len(set(hf))
    for family in FAMILIES:
        assert all(family_for_gguf(a) is family for a in family.gguf_architectures)
        assert all(family_for_hf(t) is family for t in family.hf_model_types)
    assert family_for_gguf("gemma3") is DENSE and family_for_hf("gemma3_text") is DENSE
