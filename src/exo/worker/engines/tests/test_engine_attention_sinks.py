"""The compiled decode attention with gpt-oss's sinks and sliding window (`QKernels.attend_decode`,
`csrc/attention.c`'s `exo_attend_decode_kv`) against the torch path (`attend_with_sinks`),
and the same bits for a row alone or in any batch."""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from exo.worker.engines.cpu_kernels import KernelArgumentError, QKernels, load_kernels
from exo.worker.engines.kv_cache import KVCache, PagedLayer
from exo.worker.engines.models import attention
from exo.worker.engines.models.attention import (
    AttentionShape,
    attend,
    attend_with_sinks,
    step_tensors,
    with_decode,
)
from exo.worker.engines.models.base import StepInputs
from exo.worker.engines.rope import rope_frequencies, rope_table

from .kernel_skip import skip_without_kernels

CPU = torch.device("cpu")
HD = 64
WINDOW = 20
MAX_SEQ = 200


def _kernels() -> QKernels:
    skip_without_kernels("q8")
    kernels = load_kernels()
    assert kernels is not None
    return kernels


class _Case:
    """Two caches holding the same prefixes (rows of `lengths` positions), one per path."""

    def __init__(
        self,
        heads: int,
        kv_heads: int,
        lengths: Sequence[int],
        seed: int,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.shape = AttentionShape(heads, kv_heads, HD, None, 1e-5)
        self.width = (heads + 2 * kv_heads) * HD
        self.rope = rope_table(MAX_SEQ, rope_frequencies(HD, 10000.0, None, None), CPU)
        self.sinks = torch.randn(heads, generator=self.gen) * 2
        self.lengths = list(lengths)
        self.caches = [KVCache(1, 8, MAX_SEQ, kv_heads, HD, dtype=dtype, device=CPU)
                       for _ in range(2)]  # fmt: skip
        for slot, n in enumerate(self.lengths):  # each prefix by the torch prefill
            qkv = torch.randn(1, n, self.width, generator=self.gen)
            step = StepInputs.single(slot, 0, n)
            for cache in self.caches:
                t = step_tensors(step, self.rope, WINDOW, CPU, compiled=False)
                cache.prepare(step.slots, step.starts, n)
                attend_with_sinks(qkv, self.shape, t, cache.layer(0), self.sinks)

    def decode(
        self, qkv: Tensor, slots: Sequence[int], kernels: QKernels | None, prepared: bool = False
    ) -> Tensor:
        """One decode step of rows `slots` (the compiled path on cache 1, torch on cache 0;
        `prepared`: the compiled call set up once for the step, as the models run it)."""
        cache = self.caches[kernels is not None]
        step = StepInputs(tuple(slots), tuple(self.lengths[s] for s in slots), 1)
        t = step_tensors(step, self.rope, WINDOW, CPU, compiled=kernels is not None)
        assert t.use_kernel == (kernels is not None)
        cache.prepare(step.slots, step.starts, 1)
        if prepared:
            t = with_decode(t, kernels, cache)
            assert t.decode is not None
        return attend(qkv, self.shape, t, cache.layer(0), kernels, self.sinks)


# lengths shorter and longer than the window, across the 64-position pages
LENGTHS = [[5], [WINDOW - 1], [WINDOW + 3], [130], [3, 64, 150], [1, 7, 19, 20, 21, 63, 64, 65]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2), (8, 1), (6, 2)])
@pytest.mark.parametrize("lengths", LENGTHS, ids=lambda x: f"B{len(x)}-{max(x)}")
def test_compiled_sinks_and_window_match_the_torch_path(
    heads: int, kv_heads: int, lengths: list[int], dtype: torch.dtype
) -> None:
    """On a float32 cache or a float16 one (both paths read the same rounded prefix; the new key
    each rounds from its own rotation: one float16 step apart at most)."""
    kernels = _kernels()
    case = _Case(heads, kv_heads, lengths, seed=heads * 100 + len(lengths), dtype=dtype)
    qkv = torch.randn(len(lengths), 1, case.width, generator=case.gen)
    slots = list(range(len(lengths)))
    want = case.decode(qkv, slots, None)
    got = case.decode(qkv, slots, kernels)
    tol = 1e-4 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(got, want, rtol=tol, atol=tol / 10)
    # the new keys and values landed where the torch path put them
    for slot, n in enumerate(lengths):
        page = n // 64
        mine = case.caches[1].pages[case.caches[1].table[slot][page]][0, :, :, n % 64]
        theirs = case.caches[0].pages[case.caches[0].table[slot][page]][0, :, :, n % 64]
        assert mine.dtype == dtype
        step = 1e-5 if dtype == torch.float32 else 1e-3  # float16: one rounding step (< 2^-10)
        torch.testing.assert_close(mine, theirs, rtol=step, atol=step / 10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("lengths", LENGTHS[-2:], ids=lambda x: f"B{len(x)}-{max(x)}")
def test_the_call_set_up_once_a_step_gives_the_same_bits(
    lengths: list[int], dtype: torch.dtype
) -> None:
    """`with_decode`'s DecodeAttention (what the models run) against the call set up for one
    layer alone (`QKernels.attend_decode`): the same outputs and cache writes, bit for bit."""
    kernels = _kernels()
    alone, prepared = (_Case(6, 2, lengths, seed=7, dtype=dtype) for _ in range(2))
    qkv = torch.randn(len(lengths), 1, alone.width, generator=alone.gen)
    slots = list(range(len(lengths)))[::-1]
    want = alone.decode(qkv, slots, kernels)
    got = prepared.decode(qkv, slots, kernels, prepared=True)
    assert torch.equal(got, want)
    for slot, n in enumerate(lengths):
        a, b = (c.caches[1] for c in (alone, prepared))
        page = n // 64
        assert torch.equal(a.pages[a.table[slot][page]], b.pages[b.table[slot][page]])


def _attend(
    kernels: QKernels,
    qkv: Tensor,
    shape: tuple[int, int, int],
    rope: Tensor,
    cache: PagedLayer,
    positions: Tensor,
    sinks: Tensor | None,
    window: int | None,
) -> Tensor:
    """One decode step of the compiled attention, in the torch path's argument order."""
    heads, kv_heads, hd = shape
    return kernels.attend_decode(
        qkv, heads, kv_heads, hd, rope, None, 1e-5, cache, positions, sinks=sinks, window=window
    )


def test_sinks_change_the_result_and_the_window_drops_old_keys() -> None:
    """The comparison above can fail: without sinks, or attending to every key, the compiled
    result differs from gpt-oss's attention."""
    kernels = _kernels()
    case = _Case(4, 2, [100, 40], seed=7)
    qkv = torch.randn(2, 1, case.width, generator=case.gen)
    want = case.decode(qkv, [0, 1], None)
    cache = case.caches[1]
    cache.prepare((0, 1), (100, 40), 1)
    pos = torch.tensor([100, 40])
    shape = (4, 2, HD)
    paged = cache.layer(0).paged()
    windowed = _attend(kernels, qkv, shape, case.rope, paged, pos, case.sinks, WINDOW)
    no_sinks = _attend(kernels, qkv, shape, case.rope, paged, pos, None, WINDOW)
    every_key = _attend(kernels, qkv, shape, case.rope, paged, pos, case.sinks, None)
    torch.testing.assert_close(windowed, want, rtol=1e-4, atol=1e-5)
    assert (no_sinks - want).abs().max() > 1e-3
    assert (every_key - want).abs().max() > 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("batch", [3, 8])
def test_a_row_gets_the_same_bits_alone_or_in_a_batch(batch: int, dtype: torch.dtype) -> None:
    kernels = _kernels()
    lengths = [4, 150, 21, 64, 9, 100, 20, 130][:batch]
    case = _Case(8, 2, lengths, seed=batch, dtype=dtype)
    qkv = torch.randn(batch, 1, case.width, generator=case.gen)
    together = case.decode(qkv, list(range(batch)), kernels)
    for row in range(batch):  # the same step again, one row at a time (its k, v rewritten)
        alone = case.decode(qkv[row : row + 1], [row], kernels)
        assert torch.equal(alone[0], together[row]), row


def test_bad_arguments_are_refused_before_c() -> None:
    kernels = _kernels()
    case = _Case(4, 2, [10], seed=1)
    cache = case.caches[1]
    cache.prepare((0,), (10,), 1)
    qkv, pos, paged = torch.zeros(1, 1, case.width), torch.tensor([10]), cache.layer(0).paged()
    with pytest.raises(KernelArgumentError, match="sinks"):
        _attend(kernels, qkv, (4, 2, HD), case.rope, paged, pos, torch.zeros(3), None)
    with pytest.raises(KernelArgumentError, match="window"):
        _attend(kernels, qkv, (4, 2, HD), case.rope, paged, pos, case.sinks, 0)
    with pytest.raises(KernelArgumentError, match="qkv"):
        _attend(kernels, qkv[..., 1:], (4, 2, HD), case.rope, paged, pos, case.sinks, 8)
    with pytest.raises(KernelArgumentError, match="position"):
        _attend(kernels, qkv, (4, 2, HD), case.rope, paged, torch.tensor([64]), None, 8)


def test_gpt_oss_decodes_on_the_compiled_attention(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gpt-oss model on the kernels (tiny, window 6, prompt of 12) runs its decode steps'
    sink attention compiled: the torch path sees prefill only, and the tokens are the same as
    with the torch path's decode."""
    pytest.importorskip("transformers")
    from .moe_models import CASES, build_hf_model, write_gguf
    from .test_engine_moe_families import PROMPT, greedy, load

    skip_without_kernels("q8")
    path = tmp_path / "gpt-oss-Q8_0.gguf"
    write_gguf(build_hf_model(CASES["gpt-oss"], tmp_path / "hf"), CASES["gpt-oss"], path, "Q8_0")
    model = load(path, "q8")
    torch_steps: list[int] = []

    def counted(qkv: Tensor, *args: Any) -> Tensor:
        torch_steps.append(qkv.shape[1])
        return attend_with_sinks(qkv, *args)

    monkeypatch.setattr(attention, "attend_with_sinks", counted)
    compiled, _ = greedy(model, PROMPT, 12)
    assert torch_steps and all(n == len(PROMPT) for n in torch_steps)  # prefill only
    monkeypatch.setattr(model, "_kernels", None)  # the torch decode
    torch_steps.clear()
    assert greedy(model, PROMPT, 12)[0] == compiled
    assert 1 in torch_steps
