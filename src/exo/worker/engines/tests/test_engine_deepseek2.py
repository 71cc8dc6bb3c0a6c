"""The deepseek2 family (MLA, YaRN, dense first layer, group-limited sigmoid MoE with a shared
expert) against transformers' own `DeepseekV3ForCausalLM`, from safetensors and from GGUF
files in llama.cpp's names (both kv_b layouts), quantised to Q8_0, batched, split in two
pipeline shards and in two tensor ranks."""

import json
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
from exo.worker.engines.engine import load_family, load_model, load_shard_weights
from exo.worker.engines.materialise import kernel_plan
from exo.worker.engines.models.base import BuildOptions, ShardModel, StepInputs
from exo.worker.engines.models.deepseek2 import DeepseekLayer
from exo.worker.engines.models.deepseek2_files import DeepseekConfig
from exo.worker.engines.models.moe import MoeFeedForward, MoeWeights
from exo.worker.engines.qtensor import QuantTensor
from exo.worker.engines.sampling import SamplingParams
from exo.worker.engines.weights import TensorParallel

from .deepseek_models import CONFIG, build_deepseek, write_deepseek_gguf
from .test_engine_tensor_parallel import ThreadedAllReduce

pytest.importorskip("transformers")

PROMPT = [5, 9, 33, 70, 101, 12, 44, 7, 150, 3, 88, 61]
PROMPTS = [PROMPT, [17, 140, 64, 31, 99, 8, 120], [3, 4], [150, 2, 77, 10, 41], [66] * 9]


class _Files:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.hf = build_deepseek(tmp / "hf")
        self.paths: dict[str, Path] = {"safetensors": tmp / "hf"}

    def path(self, source: str) -> Path:
        if source not in self.paths:
            dtype = "Q8_0" if source.endswith("Q8_0") else "F32"
            split = "kv_b" not in source
            self.paths[source] = write_deepseek_gguf(
                self.hf, self.tmp / f"{source}.gguf", dtype, split_kv_b=split
            )
        return self.paths[source]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> _Files:
    return _Files(tmp_path_factory.mktemp("deepseek2"))


def _dense_model(path: Path, start: int = 0, end: int | None = None, **opts: Any) -> ShardModel:
    family, config = load_family(path)
    weights = load_shard_weights(path, start, config.n_layers if end is None else end)
    return family.build(weights, BuildOptions(**opts))


def _greedy(model: ShardModel, prompt: list[int], n: int) -> list[int]:
    cache = model.new_cache(1, len(prompt) + n)
    out: list[int] = []
    with torch.inference_mode():
        logits = model.forward(torch.tensor([prompt]), StepInputs.single(0, 0, len(prompt)), cache)
        for i in range(n):
            out.append(int(logits[0].argmax()))
            step = StepInputs.single(0, len(prompt) + i, 1)
            logits = model.forward(torch.tensor([[out[-1]]]), step, cache)
    return out


def _hf_greedy(hf: Any, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


@pytest.mark.parametrize("source", ["safetensors", "gguf-F32", "gguf-F32-kv_b"])
def test_logits_match_transformers(files: _Files, source: str) -> None:
    """Every position's logits within 1e-3 of the logit range of transformers' float32 ones,
    and a decode step after the prompt too (the cached latents)."""
    model = _dense_model(files.path(source))
    with torch.inference_mode():
        ref = files.hf(torch.tensor([[*PROMPT, 42]])).logits[0].float()
        cache = model.new_cache(1, 32)
        ours = model.forward(
            torch.tensor([PROMPT]), StepInputs.single(0, 0, len(PROMPT)), cache, every_position=True
        )[0]
        step = model.forward(torch.tensor([[42]]), StepInputs.single(0, len(PROMPT), 1), cache)[0]
    bound = 1e-3 * float(ref.max() - ref.min())
    assert float((ours - ref[:-1]).abs().max()) <= bound
    assert float((step - ref[-1]).abs().max()) <= bound


V2_LITE = {  # DeepSeek V2-Lite's shape of features: no q LoRA, softmax greedy routing, one group
    "q_lora_rank": None,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "greedy",
    "norm_topk_prob": False,
    "routed_scaling_factor": 1.0,
    "rope_parameters": {**CONFIG["rope_parameters"], "mscale": 0.707, "mscale_all_dim": 0.707},
}


@pytest.mark.parametrize(
    ("v2", "overrides"),
    [
        (False, {"q_lora_rank": None, "rope_interleave": False}),  # q = x Wq^T; half-split rotary
        (True, V2_LITE),
        # DeepSeek V2's group-limited greedy routing: 8 experts in 4 groups, 2 groups allowed
        (True, {**V2_LITE, "n_group": 4, "topk_group": 2, "topk_method": "group_limited_greedy",
                "routed_scaling_factor": 1.5}),
    ],
    ids=["v3-no-q-lora-half-split", "v2-lite", "v2-group-limited"],
)
def test_variants_match_transformers(tmp_path: Path, v2: bool, overrides: dict[str, Any]) -> None:
    hf = build_deepseek(tmp_path / "hf", v2=v2, **overrides)
    model = _dense_model(tmp_path / "hf")
    with torch.inference_mode():
        ref = hf(torch.tensor([PROMPT])).logits[0].float()
        step = StepInputs.single(0, 0, len(PROMPT))
        ours = model.forward(torch.tensor([PROMPT]), step, model.new_cache(1, 16), True)[0]
    assert float((ours - ref).abs().max()) <= 1e-3 * float(ref.max() - ref.min())


def test_32_greedy_tokens_match_transformers(files: _Files) -> None:
    expected = _hf_greedy(files.hf, PROMPT, 32)
    assert len(set(expected)) > 3  # a real continuation, not one token repeated
    assert _greedy(_dense_model(files.path("safetensors")), PROMPT, 32) == expected


def _forced(model: ShardModel, prompt: list[int], tokens: list[int]) -> Tensor:
    """Prefill `prompt`, then decode `tokens` one at a time: the logits of each step."""
    cache = model.new_cache(1, len(prompt) + len(tokens) + 1)
    with torch.inference_mode():
        out = [model.forward(torch.tensor([prompt]), StepInputs.single(0, 0, len(prompt)), cache)]
        for i, token in enumerate(tokens):
            step = StepInputs.single(0, len(prompt) + i, 1)
            out.append(model.forward(torch.tensor([[token]]), step, cache))
    return torch.cat(out).float()


def test_q8_0_blocks_give_the_dequantised_files_tokens(files: _Files) -> None:
    """The Q8_0 file held in its blocks (experts as row views of the merged 3-D tensors) gives
    the greedy tokens of the same file dequantised and run densely: 16 tokens on 5 prompts."""
    path = files.path("gguf-Q8_0")
    family, config = load_family(path)
    blocks = load_shard_weights(path, 0, config.n_layers, plan=kernel_plan(torch.float32, False))
    last = blocks.layers[-1]
    assert isinstance(last, DeepseekLayer)
    moe = last.ffn
    assert isinstance(moe, MoeWeights) and isinstance(moe.experts.gate[0], QuantTensor)
    kept, dense = family.build(blocks, BuildOptions()), _dense_model(path)
    for prompt in PROMPTS:
        tokens = _greedy(dense, prompt, 16)
        assert _greedy(kept, prompt, 16) == tokens, prompt
        torch.testing.assert_close(_forced(kept, prompt, tokens), _forced(dense, prompt, tokens))


def _moes(model: ShardModel) -> list[MoeFeedForward]:
    blocks: list[object] = getattr(model, "blocks", [])
    found = [getattr(b, "ffn", None) for b in blocks] + [getattr(b, "moe", None) for b in blocks]
    return [m for m in found if isinstance(m, MoeFeedForward)]


def forced_on_the_same_routes(
    reference: ShardModel, model: ShardModel, prompt: list[int], tokens: list[int]
) -> tuple[Tensor, Tensor]:
    """`_forced` logits of both models, `model`'s experts and weights replayed from the
    reference's routing (the same tokens through the same layers, call for call): a near-tie
    of router scores cannot send the two to different experts."""
    routes: list[tuple[Tensor, Tensor]] = []
    fused = [(m, m.fused) for m in (*_moes(reference), *_moes(model))]
    for m, _ in fused:  # the torch path calls `route` (the one C call routes by itself)
        m.fused = None
    for moe in _moes(reference):
        route = moe.route

        def record(x: Tensor, route: Any = route) -> tuple[Tensor, Tensor]:
            routes.append(route(x))
            return routes[-1]

        setattr(moe, "route", record)  # noqa: B010  (an instance's method, wrapped)
    want = _forced(reference, prompt, tokens)
    replay = iter(routes)
    moes = _moes(model)
    assert moes and len(moes) == len(_moes(reference))

    def replayed(x: Tensor) -> tuple[Tensor, Tensor]:
        return next(replay)

    for moe in moes:
        setattr(moe, "route", replayed)  # noqa: B010
    got = _forced(model, prompt, tokens)
    assert next(replay, None) is None  # every recorded route replayed
    for m in (*moes, *_moes(reference)):
        delattr(m, "route")
    for m, f in fused:
        m.fused = f
    return want, got


def test_q8_0_file_run_by_the_runners_load_stays_close(files: _Files, tmp_path: Path) -> None:
    """The runner's own load (the compiled kernels where they build: 8-bit activation blocks)
    along the dequantised file's greedy path, on the same expert routes, 16 tokens on 5
    prompts: every step within 1% of the largest logit (typically 0.2%; a wrong kernel, scale
    or norm is off by tens of percent)."""
    path = files.path("gguf-Q8_0")
    _, runner = load_model(path, cache_dir=tmp_path)
    dense = _dense_model(path)
    for prompt in PROMPTS:
        tokens = _greedy(dense, prompt, 16)
        want, got = forced_on_the_same_routes(dense, runner, prompt, tokens)
        assert float((got - want).abs().max()) <= 0.01 * float(want.abs().max()), prompt


def test_batched_equals_alone(files: _Files) -> None:
    """Requests batched together (prefilled apart, decoded together at different positions)
    give the tokens each gives alone."""
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
    """Layers [0, 2) (the dense layer and an MoE one) and [2, 3) loaded apart, chained."""
    path = files.path("gguf-F32")
    whole, first, last = _dense_model(path), _dense_model(path, 0, 2), _dense_model(path, 2)
    step = StepInputs.single(0, 0, len(PROMPT))
    tokens = torch.tensor([PROMPT])
    with torch.inference_mode():
        expected = whole.forward(tokens, step, whole.new_cache(1, 16))
        hidden = first.forward_layers(first.embed(tokens), step, first.new_cache(1, 16))
        hidden = last.forward_layers(hidden, step, last.new_cache(1, 16))
        got = last.head(hidden[:, -1])
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-4)


def test_two_tensor_ranks_give_the_whole_models_logits(files: _Files) -> None:
    """Heads and expert widths split over two ranks (threads), partial outputs all-reduced."""
    path = files.path("safetensors")
    family, config = load_family(path)
    reduce = ThreadedAllReduce(2)
    results: list[Tensor | None] = [None, None]

    def rank(r: int) -> None:
        tp = TensorParallel(r, 2)
        weights = load_shard_weights(path, 0, config.n_layers, tensor_parallel=tp)
        model = family.build(weights, BuildOptions(all_reduce=reduce.for_rank(r)))
        step = StepInputs.single(0, 0, len(PROMPT))
        with torch.inference_mode():
            results[r] = model.forward(torch.tensor([PROMPT]), step, model.new_cache(1, 16))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    whole = _dense_model(path)
    with torch.inference_mode():
        expected = whole.forward(
            torch.tensor([PROMPT]), StepInputs.single(0, 0, len(PROMPT)), whole.new_cache(1, 16)
        )
    for got in results:
        assert got is not None
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-4)


def test_the_cache_holds_the_latent_only(files: _Files) -> None:
    """R + dr values a position and layer (not 2 x heads x head dims), page for page."""
    model = _dense_model(files.path("gguf-F32"))
    c = model.config
    assert isinstance(c, DeepseekConfig)
    latent = CONFIG["kv_lora_rank"] + CONFIG["qk_rope_head_dim"]
    assert model.kv_bytes_per_position() == c.n_layers * latent * 4
    cache = model.new_cache(2, 64)
    assert cache.page_bytes == 64 * model.kv_bytes_per_position()


def _save_config(folder: Path, **changes: Any) -> Path:
    raw = json.loads((folder / "config.json").read_text())
    target = folder.parent / f"changed-{len(list(folder.parent.iterdir()))}"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({**raw, **changes}))
    return target


def test_fp8_checkpoints_and_kimi_tokenizers_are_refused_with_the_gguf_route(
    files: _Files,
) -> None:
    fp8 = _save_config(
        files.path("safetensors"),
        quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]},
    )
    with pytest.raises(ValueError, match=r"FP8 .*GGUF"):
        load_family(fp8)
    kimi = _save_config(files.path("safetensors"))
    (kimi / "tiktoken.model").write_text("")
    with pytest.raises(ValueError, match=r"tiktoken.*GGUF"):
        load_family(kimi)


@pytest.mark.parametrize("source", ["safetensors", "gguf-Q8_0"])
def test_the_card_carries_each_layers_bytes_and_the_latent_cache(
    files: _Files, source: str
) -> None:
    """Placement's facts: the dense first layer is lighter than the MoE layers, and the cache
    a position needs is the engine's own figure (the latent, all layers, float32)."""
    path = files.path(source)
    card = card_from_path(path)
    assert len(card.layer_bytes) == card.n_layers == 3
    assert card.layer_bytes[0] < card.layer_bytes[1] == card.layer_bytes[2]
    assert sum(card.layer_bytes) < card.storage_size.in_bytes  # embedding and head apart
    assert card.kv_bytes_per_token == _dense_model(path).kv_bytes_per_position()
    # every matrix of transformers' model (MLA's, the experts', the router), embedding, head
    matrices = sum(p.numel() for p in files.hf.parameters() if p.dim() >= 2)
    assert card.total_params == matrices
    idle = (CONFIG["n_routed_experts"] - CONFIG["num_experts_per_tok"]) * 3 * 64 * 32
    assert card.active_params == matrices - 2 * idle  # two MoE layers
    assert (card.n_experts, card.experts_per_token) == (8, 2)


def test_a_next_turn_reuses_the_cached_latents(files: _Files) -> None:
    """A request that extends a finished one's prompt reuses its cached latents (the prefix
    cache) and gives the tokens of a fresh model."""
    model = _dense_model(files.path("gguf-F32"))
    gen = BatchGenerator(model, 2, 64, prefill_chunk=4)
    first = PROMPTS[0] + PROMPTS[1]
    second = [*first, 9, 99, 19]

    def run(request_id: str, prompt: list[int]) -> list[int]:
        gen.add(request_id, prompt, SamplingParams(temperature=0.0, max_tokens=8))
        tokens: list[int] = []
        while gen.active:
            tokens += [o.token_id for o in gen.step() if o.token_id is not None]
        return tokens

    assert run("a", first) == _greedy(model, first, 8)
    prefixes = gen.prefixes
    assert prefixes is not None
    take = prefixes.take
    reused: list[int] = []

    def recording_take(
        prompt: list[int], cuts: list[int] | None = None
    ) -> tuple[int, list[int]] | None:
        found = take(prompt, cuts)
        reused.append(0 if found is None else found[0])
        return found

    setattr(prefixes, "take", recording_take)  # noqa: B010  (an instance's method, wrapped)
    assert run("b", second) == _greedy(model, second, 8)
    assert reused and reused[0] > 0  # the first turn's positions came from the cache


def test_hub_cards_carry_the_latent_cache_as_the_files_do(files: _Files, tmp_path: Path) -> None:
    """A card built from the hub's config.json or GGUF header (before any download) reserves
    the engine's latent cache, as the card built from the files does."""
    (tmp_path / "gg").mkdir()
    write_deepseek_gguf(files.hf, tmp_path / "gg" / "Tiny-Q8_0.gguf", "Q8_0")
    hub = FakeHub()
    hub.add_folder("org/tiny-deepseek", files.path("safetensors"))
    hub.add_folder("org/tiny-deepseek-GGUF", tmp_path / "gg")
    expected = _dense_model(files.path("safetensors")).kv_bytes_per_position()
    with serve_hub(hub):
        settings = HubSettings(cache_dir=tmp_path / "cache", endpoint=hub.url)
        for name in ("org/tiny-deepseek", "org/tiny-deepseek-GGUF:Q8_0"):
            card = card_from_hub(name, settings)
            assert card.n_layers == 3 and card.kv_bytes_per_token == expected, name
