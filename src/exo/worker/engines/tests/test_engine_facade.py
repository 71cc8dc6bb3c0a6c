"""`load_engine`: the facade the runner uses, on the embedded model."""

from pathlib import Path

import torch

from exo.worker.engines.cpu_kernels import load_kernels
from exo.worker.engines.engine import load_engine
from exo.worker.engines.linear import choose_weight_format
from exo.worker.engines.sampling import SamplingParams
from exo.worker.engines.text import IncrementalDetokenizer


def test_load_engine_generates_and_streams(gguf_path: Path, tokenizer_cache: Path) -> None:
    progress: list[tuple[int, int]] = []
    engine = load_engine(
        gguf_path,
        threads=1,
        cache_dir=tokenizer_cache,
        progress=lambda done, total: progress.append((done, total)),
    )
    assert progress[-1] == (30, 30) and len(progress) == 30
    assert engine.is_full_model and engine.config.n_layers == 30
    expected_format = "q4" if load_kernels(tokenizer_cache / "kernels") else "fp16"
    assert engine.model.weight_format == expected_format
    engine.warmup()

    prompt = engine.tokenizer.encode_chat(
        [{"role": "user", "content": "What is the capital of France?"}]
    )
    gen = engine.batch_generator(max_batch=2, max_seq=256)
    gen.add("r1", prompt, SamplingParams(temperature=0.0, max_tokens=12))
    detok = IncrementalDetokenizer(engine.tokenizer.decode)
    text = ""
    while gen.active:
        for out in gen.step():
            if out.token_id is not None and out.finish_reason != "stop":
                text += detok.push(out.token_id)
    text += detok.flush()
    assert "Paris" in text
    assert (
        engine.tokenizer.decode(
            list(engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=12)))
        )
        == text
    )


def test_weight_format_choice() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    kernels = load_kernels()
    if kernels is not None:
        assert choose_weight_format("Q4_1", cpu, torch.float32, kernels) == "q4"
        assert choose_weight_format("Q4_K", cpu, torch.float32, kernels) == "q8"
        assert choose_weight_format("BF16", cpu, torch.float32, kernels) == "q8"
    assert choose_weight_format("Q4_1", cpu, torch.float32, None) in ("fp16", "dense")
    assert choose_weight_format("Q4_1", cpu, torch.bfloat16, kernels) == "dense"
    assert choose_weight_format("Q4_1", cuda, torch.bfloat16, None) == "dense"
