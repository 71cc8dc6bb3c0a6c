"""Packed prefill on the other families (MoE experts, MLA, attention sinks): prompt chunks at
the same positions in one forward give each request the tokens it gets alone."""

import pytest
from torch import Tensor

from exo.worker.engines.batch import BatchGenerator
from exo.worker.engines.engine import rows_apart
from exo.worker.engines.kv_cache import KVCache
from exo.worker.engines.models.base import StepInputs

from .kernel_skip import skip_without_kernels
from .test_engine_moe_families import (
    FAMILIES,
    _generate,  # pyright: ignore[reportPrivateUsage]
    _Models,  # pyright: ignore[reportPrivateUsage]
    load,
)

SAME_LENGTH = [[(13 * i + 7 * j) % 150 + 5 for j in range(9)] for i in range(3)]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> _Models:
    return _Models(tmp_path_factory.mktemp("moe-models"))


@pytest.mark.parametrize("name", FAMILIES)
def test_packed_prefill_gives_each_request_its_tokens_alone(
    models: _Models, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    skip_without_kernels("q8")
    model = load(models.path(name, "Q8_0"), "q8")
    assert rows_apart(model)  # every linear (the experts too) on the C kernels
    alone = {
        f"r{i}": _generate(BatchGenerator(model, 1, 64, eos_token_ids=[]), {"a": p}, 6)["a"]
        for i, p in enumerate(SAME_LENGTH)
    }
    calls: list[tuple[int, int]] = []
    forward = model.forward

    def counted(
        tokens: Tensor, step: StepInputs, cache: KVCache, every_position: bool = False
    ) -> Tensor:
        calls.append((len(step.slots), step.n_new))
        return forward(tokens, step, cache, every_position)

    monkeypatch.setattr(model, "forward", counted)
    gen = BatchGenerator(model, 3, 64, eos_token_ids=[], prefill_chunk=64, pack_prefill=True)
    got = _generate(gen, {f"r{i}": p for i, p in enumerate(SAME_LENGTH)}, 6)
    assert calls[0] == (3, len(SAME_LENGTH[0]))  # the three prompts in one forward
    assert got == alone
