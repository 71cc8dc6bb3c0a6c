"""8-bit activations (the default, EXO_ACTIVATIONS=8) through the runner's load of a generated
quantised file: requests batched together give the tokens each gives alone, the layers running
the repacked groups' 8-bit dots (the head, 49159 rows, the file rows' per-row ones; Q5_1 and Q5_K,
which have no repacked layout, the per-row ones everywhere)."""

from pathlib import Path
from typing import Any

import pytest
import torch

from exo.modelgen import Request, generate
from exo.worker.engines.batch import BatchGenerator
from exo.worker.engines.engine import load_model
from exo.worker.engines.kinds import BY_KERNEL
from exo.worker.engines.linear import QuantLinear
from exo.worker.engines.models.base import ShardModel, StepInputs
from exo.worker.engines.sampling import SamplingParams

PROMPTS = [[1, 5, 9, 14, 2], [3, 3, 7], [11, 4, 8, 15, 16, 23, 42], [6]]


def _quant_linears(obj: Any, seen: set[int]) -> list[QuantLinear]:
    """The QuantLinear layers reachable from obj through exo objects and containers."""
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, QuantLinear):
        return [obj]
    if isinstance(obj, dict):
        items: list[Any] = list(obj.values())  # pyright: ignore[reportUnknownArgumentType]
    elif isinstance(obj, (list, tuple)):
        items = list(obj)  # pyright: ignore[reportUnknownArgumentType]
    elif type(obj).__module__.startswith("exo.") and hasattr(obj, "__dict__"):
        items = list(vars(obj).values())
    else:
        return []
    return [q for item in items for q in _quant_linears(item, seen)]


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


@pytest.mark.parametrize("quant", ["Q4_0", "Q4_K_M", "Q5_K_M", "Q5_0", "Q5_1"])  # issue 22 q5dots: Q5_*
def test_batched_equals_alone_at_8_bits(
    quant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXO_ACTIVATIONS", "8")
    path = generate(Request("llama", "tiny", quant, tmp_path / f"tiny-{quant}.gguf"))
    _, model = load_model(path, cache_dir=tmp_path)
    layers = _quant_linears(model, set())
    assert layers and all(q._kernels.activations == 8 for q in layers)  # pyright: ignore[reportPrivateUsage]
    for q in layers:  # groups where the rows come in 8s (the head's 49159 rows: the file's rows)
        grouped = [BY_KERNEL[k][1] for k in q.kinds]
        has = [BY_KERNEL[k][0].grouped is not None for k in q.kinds]  # Q5_1, Q5_K: rows alone
        assert grouped == [h and p.shape[0] % 8 == 0 for h, p in zip(has, q.parts, strict=True)], q.kernel
        assert all(BY_KERNEL[k][0].act8 for k in q.kinds), q.kinds  # every layer's 8-bit dots run
    alone = [_greedy(model, p, 8) for p in PROMPTS]
    gen = BatchGenerator(model, len(PROMPTS), 32, prefill_chunk=4)
    for i, p in enumerate(PROMPTS):
        gen.add(str(i), p, SamplingParams(temperature=0.0, max_tokens=8))
    got: dict[str, list[int]] = {str(i): [] for i in range(len(PROMPTS))}
    while gen.active:
        for out in gen.step():
            assert out.error is None
            if out.token_id is not None:
                got[out.request_id].append(out.token_id)
    assert [got[str(i)] for i in range(len(PROMPTS))] == alone
