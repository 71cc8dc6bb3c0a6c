"""The glm4moe family (partial rotary, QK-norm, attention biases, dense first layer,
group-limited sigmoid MoE with a shared expert) against transformers' own
`Glm4MoeForCausalLM`, from safetensors and from GGUF files in llama.cpp's names, quantised to
Q8_0, batched, split in two pipeline shards and in two tensor ranks."""

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from exo.worker.download.cards import card_from_hub
from exo.worker.download.hub import HubSettings
from exo.worker.download.local import card_from_path
from exo.worker.download.tests.hub_server import FakeHub, serve_hub
from exo.worker.engines.batch import BatchGenerator
from exo.worker.engines.cpu_kernels import load_kernels
from exo.worker.engines.engine import load_family, load_model, load_shard_weights
from exo.worker.engines.materialise import kernel_plan
from exo.worker.engines.models.base import BuildOptions, ShardModel, StepInputs
from exo.worker.engines.models.glm4moe_files import GlmConfig, GlmLayer
from exo.worker.engines.qtensor import QuantTensor
from exo.worker.engines.sampling import SamplingParams
from exo.worker.engines.weights import TensorParallel

from .glm_models import build_glm, write_glm_gguf
from .test_engine_deepseek2 import (
    PROMPT,
    PROMPTS,
    _dense_model,
    _forced,
    _greedy,
    _hf_greedy,
    forced_on_the_same_routes,
)
from .test_engine_tensor_parallel import ThreadedAllReduce

pytest.importorskip("transformers")


class _Files:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.hf = build_glm(tmp / "hf")
        self.paths: dict[str, Path] = {"safetensors": tmp / "hf"}

    def path(self, source: str) -> Path:
        if source not in self.paths:
            dtype = "Q8_0" if source.endswith("Q8_0") else "F32"
            self.paths[source] = write_glm_gguf(self.hf, self.tmp / f"{source}.gguf", dtype)
        return self.paths[source]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> _Files:
    return _Files(tmp_path_factory.mktemp("glm4moe"))


def _reference(files: _Files) -> Tensor:
    with torch.inference_mode():
        return files.hf(torch.tensor([[*PROMPT, 42]])).logits[0].float()


@pytest.mark.parametrize("source", ["safetensors", "gguf-F32"])
@pytest.mark.parametrize("compiled", [False, True], ids=["torch", "compiled-attention"])
def test_logits_match_transformers(files: _Files, source: str, compiled: bool) -> None:
    """Every prompt position, then one decode step (the compiled decode attention where the
    kernels build: partial rotary as pairs turning at frequency 0)."""
    kernels = load_kernels() if compiled else None
    if compiled and kernels is None:
        pytest.skip("no compiled CPU kernels here")
    model = _dense_model(files.path(source), kernels=kernels)
    c = model.config
    assert isinstance(c, GlmConfig) and c.rotary_dim == c.head_dim // 2 and c.n_layers == 3
    ref = _reference(files)
    with torch.inference_mode():
        cache = model.new_cache(1, 32)
        ours = model.forward(
            torch.tensor([PROMPT]), StepInputs.single(0, 0, len(PROMPT)), cache, every_position=True
        )[0]
        step = model.forward(torch.tensor([[42]]), StepInputs.single(0, len(PROMPT), 1), cache)[0]
    bound = 1e-3 * float(ref.max() - ref.min())
    assert float((ours - ref[:-1]).abs().max()) <= bound
    assert float((step - ref[-1]).abs().max()) <= bound


def test_32_greedy_tokens_match_transformers(files: _Files) -> None:
    expected = _hf_greedy(files.hf, PROMPT, 32)
    assert len(set(expected)) > 3
    assert _greedy(_dense_model(files.path("safetensors")), PROMPT, 32) == expected


def test_q8_0_blocks_give_the_dequantised_files_tokens(files: _Files) -> None:
    path = files.path("gguf-Q8_0")
    family, config = load_family(path)
    blocks = load_shard_weights(path, 0, config.n_layers, plan=kernel_plan(torch.float32, False))
    last = blocks.layers[-1]
    assert isinstance(last, GlmLayer) and last.moe is not None
    assert isinstance(last.moe.experts.down[0], QuantTensor)
    kept, dense = family.build(blocks, BuildOptions()), _dense_model(path)
    for prompt in PROMPTS:
        tokens = _greedy(dense, prompt, 16)
        assert _greedy(kept, prompt, 16) == tokens, prompt
        torch.testing.assert_close(_forced(kept, prompt, tokens), _forced(dense, prompt, tokens))


def test_q8_0_file_run_by_the_runners_load_stays_close(files: _Files, tmp_path: Path) -> None:
    """As for deepseek2: on the dequantised file's greedy path and expert routes, every step of
    the runner's own load within 1% of the largest logit, 16 tokens on 5 prompts."""
    path = files.path("gguf-Q8_0")
    _, runner = load_model(path, cache_dir=tmp_path)
    dense = _dense_model(path)
    for prompt in PROMPTS:
        tokens = _greedy(dense, prompt, 16)
        want, got = forced_on_the_same_routes(dense, runner, prompt, tokens)
        assert float((got - want).abs().max()) <= 0.01 * float(want.abs().max()), prompt


def test_batched_equals_alone(files: _Files) -> None:
    model = _dense_model(files.path("gguf-F32"))
    alone = [_greedy(model, p, 10) for p in PROMPTS]
    gen = BatchGenerator(model, len(PROMPTS), 32, prefill_chunk=4)
    for i, p in enumerate(PROMPTS):
        gen.add(str(i), p, SamplingParams(temperature=0.0, max_tokens=10))
    got: dict[str, list[int]] = {str(i): [] for i in range(len(PROMPTS))}
    while gen.active:
        for out in gen.step():
            assert out.error is None
            if out.token_id is not None:
                got[out.request_id].append(out.token_id)
    assert [got[str(i)] for i in range(len(PROMPTS))] == alone


def test_two_pipeline_shards_give_the_whole_models_logits(files: _Files) -> None:
    path = files.path("gguf-F32")
    whole, first, last = _dense_model(path), _dense_model(path, 0, 2), _dense_model(path, 2)
    step, tokens = StepInputs.single(0, 0, len(PROMPT)), torch.tensor([PROMPT])
    with torch.inference_mode():
        expected = whole.forward(tokens, step, whole.new_cache(1, 16))
        hidden = first.forward_layers(first.embed(tokens), step, first.new_cache(1, 16))
        got = last.head(last.forward_layers(hidden, step, last.new_cache(1, 16))[:, -1])
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-4)


def test_two_tensor_ranks_give_the_whole_models_logits(files: _Files) -> None:
    path = files.path("safetensors")
    family, config = load_family(path)
    reduce = ThreadedAllReduce(2)
    results: list[Any] = [None, None]

    def rank(r: int) -> None:
        weights = load_shard_weights(path, 0, config.n_layers, tensor_parallel=TensorParallel(r, 2))
        model: ShardModel = family.build(weights, BuildOptions(all_reduce=reduce.for_rank(r)))
        with torch.inference_mode():
            step = StepInputs.single(0, 0, len(PROMPT))
            results[r] = model.forward(torch.tensor([PROMPT]), step, model.new_cache(1, 16))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    whole = _dense_model(path)
    with torch.inference_mode():
        step = StepInputs.single(0, 0, len(PROMPT))
        expected = whole.forward(torch.tensor([PROMPT]), step, whole.new_cache(1, 16))
    for got in results:
        assert isinstance(got, Tensor)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-4)


def test_the_card_counts_the_models_layers_only(files: _Files) -> None:
    """The GGUF's multi-token-prediction block is neither a layer nor in the layers' bytes; the
    cache is keys and values of the kv heads (no latent figure)."""
    card = card_from_path(files.path("gguf-Q8_0"))
    assert card.n_layers == len(card.layer_bytes) == 3
    assert card.layer_bytes[0] < card.layer_bytes[1] == card.layer_bytes[2]
    assert card.kv_bytes_per_token == 0 and card.num_kv_heads == 2 and card.head_dim == 32
    assert card.total_params == sum(p.numel() for p in files.hf.parameters() if p.dim() >= 2)
    assert (card.n_experts, card.experts_per_token) == (8, 2)


def test_a_hub_card_of_a_glm_gguf_counts_the_models_layers_only(
    files: _Files, tmp_path: Path
) -> None:
    """The GGUF header's block_count includes the prediction block: the card (and so placement's
    layer ranges) must not."""
    (tmp_path / "gg").mkdir()
    write_glm_gguf(files.hf, tmp_path / "gg" / "Tiny-Q8_0.gguf", "Q8_0")
    hub = FakeHub()
    hub.add_folder("org/tiny-glm-GGUF", tmp_path / "gg")
    with serve_hub(hub):
        settings = HubSettings(cache_dir=tmp_path / "cache", endpoint=hub.url)
        card = card_from_hub("org/tiny-glm-GGUF:Q8_0", settings)
    assert card.n_layers == 3 and card.kv_bytes_per_token == 0
