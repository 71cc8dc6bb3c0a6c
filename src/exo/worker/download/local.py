"""Finding a model's files on this node. Models with a local source need no download;
nothing here requires the Hugging Face hub."""

from pathlib import Path

from exo.shared.models.model_cards import ModelCard
from exo.shared.types.worker.downloads import (
    DownloadCompleted,
    DownloadFailed,
    DownloadProgress,
)


def locate_model(card: ModelCard, models_dir: Path) -> DownloadProgress:
    candidates: list[Path] = []
    if card.source:
        candidates.append(Path(card.source))
    candidates.append(models_dir / card.model_id.replace("/", "--"))
    for path in candidates:
        if path.is_file() or (path.is_dir() and any(path.glob("*.safetensors"))):
            return DownloadCompleted(path=str(path))
    where = ", ".join(str(p) for p in candidates)
    return DownloadFailed(
        error_message=f"model files for {card.model_id} not found (looked in {where}); "
        "this node has no download source for it"
    )
