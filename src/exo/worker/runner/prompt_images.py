"""A request's images on their way into the prompt (rank 0 of an instance: the first stage).

The chat template writes one marker per image (`chat_prompt` gives it the message's image
parts); the model's `VisionEncoder` expands each marker into the image's placeholder tokens,
and once the prompt is tokenized, encodes the images into the `ImageSpans` the batcher
carries. Every problem here is the request's: an `ImageError` (a 400)."""

from collections.abc import Sequence

from exo.shared.types.text_generation import InputImage, TextGenerationTaskParams
from exo.worker.engines.images import ImageSpans, VisionEncoder


class ImageError(ValueError):
    """The request's images cannot go into this model's prompt."""


def request_images(params: TextGenerationTaskParams) -> list[InputImage]:
    """The request's images, in message order."""
    return [image for message in params.input for image in message.images]


def image_refusal(
    vision: VisionEncoder | None, tensor_parallel: bool, params: TextGenerationTaskParams
) -> str | None:
    """Why this runner cannot take the request's images, if it cannot."""
    if not request_images(params):
        return None
    if vision is None:
        return (
            f"{params.model}: this node's engine cannot read images for this model "
            "(no vision tower is loaded for it)"
        )
    if tensor_parallel:
        return f"{params.model}: images are not served by a tensor-parallel instance yet"
    if params.prompt_ids is not None:
        return "images cannot go with a prompt given as token ids"
    return None


def expand_markers(vision: VisionEncoder | None, text: str, images: Sequence[InputImage]) -> str:
    """The rendered prompt with its image markers expanded (unchanged without images)."""
    if vision is None or not images:
        return text
    try:
        return vision.expand(text, images)
    except ValueError as e:
        raise ImageError(str(e)) from e


def encode_images(
    vision: VisionEncoder | None, ids: Sequence[int], images: Sequence[InputImage]
) -> ImageSpans | None:
    """The images encoded at their placeholders in the tokenized prompt (None without)."""
    if vision is None or not images:
        return None
    try:
        return vision.encode(ids, images)
    except ValueError as e:
        raise ImageError(str(e)) from e
