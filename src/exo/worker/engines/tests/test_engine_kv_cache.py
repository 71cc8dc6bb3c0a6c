"""The paged KV cache: memory follows the cached tokens; moves swap pages; ends free them."""

import torch

from exo.worker.engines.batch import BatchGenerator
from exo.worker.engines.kv_cache import PAGE, KVCache
from exo.worker.engines.llama import LlamaModel
from exo.worker.engines.sampling import SamplingParams
from exo.worker.engines.tokenizer import EngineTokenizer


def _cache() -> KVCache:
    return KVCache(3, 4, 1000, 2, 8, dtype=torch.float32, device=torch.device("cpu"))


def test_pages_are_allocated_as_positions_are_written() -> None:
    cache = _cache()
    assert cache.n_bytes == 0 and cache.max_bytes == 4 * 16 * cache.page_bytes
    cache.prepare((0,), (0,), 10)
    assert cache.n_bytes == cache.page_bytes
    cache.prepare((0, 2), (10, 0), PAGE)  # slot 0 crosses into its second page; slot 2 starts
    assert len(cache.table[0]) == 2 and len(cache.table[2]) == 1
    assert cache.n_bytes == 3 * cache.page_bytes


def test_a_move_hands_over_pages_and_a_new_request_starts_afresh() -> None:
    cache = _cache()
    cache.prepare((0, 1), (0, 0), 3 * PAGE)
    k = torch.randn(2, 3 * PAGE, 2, 8)
    cache.layer(1).write_and_read(k, k, 1)
    moved = list(cache.table[1])
    cache.move_slot(1, 0, 3 * PAGE)
    assert (
        cache.table[0] == moved and cache.table[1] == [] and cache.n_bytes == 3 * cache.page_bytes
    )
    cache.prepare((0,), (3 * PAGE,), 0 + 1)
    keys, _ = cache.layer(1).write_and_read(k[:1, :1], k[:1, :1], 3 * PAGE)
    torch.testing.assert_close(keys[0], k[1].transpose(0, 1))  # slot 0 now holds row 1's keys
    cache.prepare((0,), (0,), 5)  # a new request in slot 0: the old pages go
    assert cache.n_bytes == cache.page_bytes
    cache.release(0)
    assert cache.n_bytes == 0


def test_finished_requests_leave_no_pages(
    fast_model: LlamaModel, tokenizer: EngineTokenizer
) -> None:
    gen = BatchGenerator(fast_model, 3, 512, eos_token_ids=[2])
    prompts = ["Name a fruit.", "What is the capital of France?", "Count to three."]
    for i, q in enumerate(prompts):
        ids = tokenizer.encode_chat([{"role": "user", "content": q}])
        gen.add(str(i), ids, SamplingParams(temperature=0.0, max_tokens=3 + 2 * i))
    peak = 0
    for _ in range(100):
        if not gen.active:
            break
        gen.step()
        peak = max(peak, gen.cache.n_bytes)
    assert not gen.active
    assert 0 < peak < gen.cache.max_bytes // 2  # short requests hold a few pages, not 512 slots
    assert gen.cache.n_bytes == 0
