"""gpt-oss's MXFP4 safetensors against transformers' own MXFP4 decoder, and the facts a card
carries for MoE models (expert counts, active parameters, every expert in the size)."""

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from exo.shared.models.memory import running_weight_bytes
from exo.worker.download.cards import card_from_hub
from exo.worker.download.hub import HubSettings
from exo.worker.download.local import card_from_path
from exo.worker.download.tests.hub_server import FakeHub, serve_hub
from exo.worker.engines.config import LlamaConfig
from exo.worker.engines.engine import load_model, load_shard_weights
from exo.worker.engines.load_report import describe_load, shard_bytes
from exo.worker.engines.materialise import kernel_plan, running_bytes
from exo.worker.engines.model_facts import model_facts, parameter_counts
from exo.worker.engines.models import moe_files
from exo.worker.engines.models.base import StepInputs
from exo.worker.engines.models.moe import MoeWeights, split_experts
from exo.worker.engines.models.moe_files import moe_config
from exo.worker.engines.models.moe_model import MoeLayer
from exo.worker.engines.models.rotary import yarn_attention_factor, yarn_frequencies
from exo.worker.engines.qtensor import QuantTensor

from .moe_models import CASES, build_hf_model, write_gguf
from .test_engine_moe_families import PROMPT, load

pytest.importorskip("transformers")


def _random_mxfp4(shape: tuple[int, ...], gen: torch.Generator) -> tuple[Any, Any]:
    """blocks [.., G, 16] of random codes and scales [.., G] around 2^-3."""
    blocks = torch.randint(0, 256, (*shape, 16), generator=gen, dtype=torch.uint8)
    scales = torch.randint(122, 126, shape, generator=gen, dtype=torch.uint8)
    return blocks, scales


def test_mxfp4_safetensors_match_transformers_decoding_them(tmp_path: Path) -> None:
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    float_folder, folder = tmp_path / "float", tmp_path / "mxfp4"
    hf = build_hf_model(CASES["gpt-oss"], float_folder)
    c = hf.config
    e, d, f = c.num_local_experts, c.hidden_size, c.intermediate_size
    state = load_file(str(float_folder / "model.safetensors"))
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for i, layer in enumerate(hf.model.layers):
            p = f"model.layers.{i}.mlp.experts."
            for name, rows, cols in (("gate_up_proj", 2 * f, d), ("down_proj", d, f)):
                blocks, scales = _random_mxfp4((e, rows, cols // 32), gen)
                del state[p + name]
                state[p + name + "_blocks"], state[p + name + "_scales"] = blocks, scales
                decoded = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
                getattr(layer.mlp.experts, name).copy_(decoded)  # [E, in, out], as it holds them
    shutil.copytree(float_folder, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    save_file(state, str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4"}
    (folder / "config.json").write_text(json.dumps(config))

    model = load(folder)
    layer = model_layer_weights(folder)
    assert isinstance(layer.ffn, MoeWeights)
    assert all(isinstance(w, QuantTensor) and w.qtype.name == "MXFP4" for w in layer.ffn.experts.up)
    with torch.inference_mode():
        ref = hf(torch.tensor([PROMPT])).logits[0].float()
        ours = model.forward(
            torch.tensor([PROMPT]), StepInputs.single(0, 0, len(PROMPT)),
            model.new_cache(1, len(PROMPT)), every_position=True,
        )[0]  # fmt: skip
    assert float((ours - ref).abs().max()) <= 1e-3 * float(ref.max() - ref.min())


def model_layer_weights(folder: Path) -> MoeLayer:
    layer = load_shard_weights(folder, 0, 1).layers[0]
    assert isinstance(layer, MoeLayer)
    return layer


@pytest.mark.parametrize("name", list(CASES))
def test_cards_carry_expert_counts_active_parameters_and_every_experts_bytes(
    tmp_path: Path, name: str
) -> None:
    case = CASES[name]
    hf = build_hf_model(case, tmp_path / name)
    path = write_gguf(hf, case, tmp_path / f"{name}.gguf", "Q8_0")
    card = card_from_path(path)
    c = hf.config
    experts = c.num_local_experts if name == "gpt-oss" else c.num_experts
    assert (card.n_experts, card.experts_per_token) == (experts, c.num_experts_per_tok)
    hf_total = sum(p.numel() for n, p in hf.named_parameters() if p.dim() >= 2 and "bias" not in n)
    assert card.total_params == hf_total  # every matrix, every expert
    assert 0 < card.active_params < card.total_params
    # the running size the estimate counts is every expert's blocks as loaded
    weights = load_shard_weights(
        path, 0, c.num_hidden_layers, plan=kernel_plan(torch.float32, True)
    )
    loaded = sum(_layer_bytes(layer) for layer in weights.layers)
    loaded += running_bytes(weights.embed) + running_bytes(weights.lm_head)
    facts = model_facts(path)
    estimate = running_weight_bytes(facts.weight_bytes, facts.weight_format)
    assert abs(estimate - loaded) <= 0.1 * loaded


def _layer_bytes(layer: object) -> int:
    assert isinstance(layer, MoeLayer)
    a = layer.attention
    total = sum(running_bytes(w) for w in (a.wq, a.wk, a.wv, a.wo))
    ffn = layer.ffn
    if isinstance(ffn, MoeWeights):
        x = ffn.experts
        total += sum(running_bytes(w) for w in (*x.gate, *x.up, *x.down))
        total += running_bytes(ffn.router)
    else:
        total += sum(running_bytes(w) for w in (ffn.gate, ffn.up, ffn.down))
    return total


def test_the_engines_loader_reports_every_experts_format(tmp_path: Path) -> None:
    case = CASES["qwen3moe"]
    path = write_gguf(build_hf_model(case, tmp_path / "hf"), case, tmp_path / "m.gguf", "Q8_0")
    weights = load_shard_weights(path, 0, 3, plan=kernel_plan(torch.float32, True))
    _, model = load_model(path, cache_dir=tmp_path / "cache")
    line = describe_load(path, weights, model, 0.1)
    experts = case.extra["num_experts"] * 2  # two MoE layers (layer 1 is dense)
    assert f"'ffn.experts.gate:Q8_0': {experts}" in line
    assert "'ffn.router:float32': 2" in line
    assert shard_bytes(weights) >= sum(_layer_bytes(layer) for layer in weights.layers)


def test_qwen3_30b_a3b_counts_as_30b_total_and_3b_active() -> None:
    base = LlamaConfig(
        architecture="qwen3moe", n_layers=48, hidden=2048, ffn=6144, heads=32, kv_heads=4,
        head_dim=128, rope_theta=1e6, rms_eps=1e-6, vocab=151936, context_length=40960,
        tie_embeddings=False, bos_token_id=None, eos_token_ids=(), chat_template=None,
    )  # fmt: skip
    config = moe_config(base, n_experts=128, experts_per_token=8, expert_ffn=768)
    total, active = parameter_counts(config)
    assert 30.0e9 < total < 31.0e9  # the model card: 30.5B total, 3.3B activated
    assert 3.2e9 < active < 3.4e9


def test_experts_stored_fused_as_transformers_5_holds_them_load_alike(tmp_path: Path) -> None:
    """`mlp.experts.gate_up_proj` [E, 2F, D] and `down_proj` [E, D, F] instead of one tensor
    per expert: the same model, the same logits."""
    case = CASES["qwen3moe"]
    folder, fused = tmp_path / "per-expert", tmp_path / "fused"
    build_hf_model(case, folder)
    state = load_file(str(folder / "model.safetensors"))
    n = case.extra["num_experts"]
    for i in (0, 2):  # the MoE layers
        p = f"model.layers.{i}.mlp.experts."
        per = {x: [state.pop(f"{p}{e}.{x}_proj.weight") for e in range(n)]
               for x in ("gate", "up", "down")}  # fmt: skip
        state[p + "gate_up_proj"] = torch.cat(
            [torch.stack(per["gate"]), torch.stack(per["up"])], dim=1
        )
        state[p + "down_proj"] = torch.stack(per["down"])
    shutil.copytree(folder, fused, ignore=shutil.ignore_patterns("*.safetensors"))
    save_file(state, str(fused / "model.safetensors"))
    step = StepInputs.single(0, 0, len(PROMPT))
    with torch.inference_mode():
        a, b = (
            m.forward(torch.tensor([PROMPT]), step, m.new_cache(1, len(PROMPT)))
            for m in (load(folder), load(fused))
        )
    assert torch.equal(a, b)


def test_hub_cards_of_moe_models_carry_their_expert_counts(tmp_path: Path) -> None:
    case = CASES["qwen3moe"]
    hf = build_hf_model(case, tmp_path / "st")
    (tmp_path / "gg").mkdir()
    write_gguf(hf, case, tmp_path / "gg" / "Tiny-Q8_0.gguf", "Q8_0")
    hub = FakeHub()
    hub.add_folder("org/tiny-moe", tmp_path / "st")
    hub.add_folder("org/tiny-moe-GGUF", tmp_path / "gg")
    with serve_hub(hub):
        settings = HubSettings(cache_dir=tmp_path / "cache", endpoint=hub.url)
        for name in ("org/tiny-moe", "org/tiny-moe-GGUF:Q8_0"):
            card = card_from_hub(name, settings)
            assert (card.n_experts, card.experts_per_token) == (16, 4), name


@pytest.mark.parametrize("truncate", [True, False])
def test_yarn_frequencies_and_attention_factor_are_transformers(truncate: bool) -> None:
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096,
            "rope_theta": 1e6, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": truncate}  # fmt: skip
    hf = transformers.GptOssConfig(head_dim=128, max_position_embeddings=32768,
                                     rope_parameters=rope)  # fmt: skip
    ref_freqs, ref_factor = ROPE_INIT_FUNCTIONS["yarn"](hf, "cpu")
    scaling = moe_files.hf_yarn({"rope_parameters": rope})
    assert scaling is not None and scaling.truncate == truncate
    ours = yarn_frequencies(128, 1e6, scaling)
    assert torch.allclose(ours.float(), ref_freqs.float(), rtol=1e-6)
    assert yarn_attention_factor(scaling) == pytest.approx(ref_factor)


def test_hostile_moe_shapes_are_refused_with_a_message() -> None:
    base = LlamaConfig(
        architecture="qwen3moe", n_layers=2, hidden=64, ffn=96, heads=4, kv_heads=2, head_dim=16,
        rope_theta=1e4, rms_eps=1e-6, vocab=160, context_length=256, tie_embeddings=False,
        bos_token_id=None, eos_token_ids=(), chat_template=None,
    )  # fmt: skip
    with pytest.raises(ValueError, match="experts per token"):
        moe_config(base, n_experts=8, experts_per_token=9, expert_ffn=32)
    with pytest.raises(ValueError, match="MoE-layer flags"):
        moe_config(base, n_experts=8, experts_per_token=2, expert_ffn=32, moe_layers=(True,))
    with pytest.raises(ValueError, match="do not split into 3 experts"):
        split_experts(torch.zeros(16, 8), 3)
