"""Images in requests: the sources clients send (data URLs, bare base64, http(s) URLs),
checked by decoding them with Pillow, into the ``InputImage`` a task carries (the file as
sent: smaller than its pixels, and the runner decodes it again for its vision tower).

Only PNG, JPEG, WebP and GIF (its first frame) are read. An image larger than
``MAX_IMAGE_BYTES`` or than ``MAX_IMAGE_PIXELS`` is refused before its pixels are decoded (a
small file can claim a huge canvas: a decompression bomb). Every failure is an
``ImageError`` whose text says what is wrong, for the adapter to prefix with the part's name.
"""

import base64
import binascii
import hashlib
import io
import re
import warnings
from collections.abc import Callable, Sequence

from PIL import Image, UnidentifiedImageError

from exo.shared.types.text_generation import ImageFormat, InputImage

MAX_IMAGE_BYTES = 20 * 1024 * 1024
# Below Pillow's own bomb threshold, so Pillow never warns or raises first.
MAX_IMAGE_PIXELS = 40_000_000
FORMATS: tuple[ImageFormat, ...] = ("PNG", "JPEG", "WEBP", "GIF")
MEDIA_TYPES = frozenset({"image/png", "image/jpeg", "image/jpg", "image/webp", "image/gif"})
URLS_OFF = (
    "image URLs are not fetched by this node (its API setting image_url_fetch is off); "
    "send the image inline (a data: URL or base64)"
)

_DATA_URL = re.compile(r"^data:([^;,]*)((?:;[^;,]*)*),(.*)$", re.DOTALL)


class ImageError(ValueError):
    """An image the node cannot use, and why."""


def image_from_url(url: str) -> InputImage:
    """An image from a URL a client sent: a data URL decodes; http(s) is refused (fetching
    is off on this node)."""
    if url.startswith(("http://", "https://")):
        raise ImageError(URLS_OFF)
    match = _DATA_URL.match(url)
    if match is None:
        raise ImageError("the image URL must be a data: URL (data:image/png;base64,...)")
    media_type, params, payload = match.group(1), match.group(2), match.group(3)
    check_media_type(media_type or None)
    if "base64" not in params.split(";"):
        raise ImageError("the data: URL must be base64-encoded (;base64,)")
    return image_from_base64(payload)


def check_media_type(media_type: str | None) -> None:
    """A declared media type must be one we read (None: not declared; the bytes decide)."""
    if media_type is not None and media_type.lower() not in MEDIA_TYPES:
        raise ImageError(f"unsupported image type {media_type!r}: send PNG, JPEG, WebP or GIF")


def image_from_base64(payload: str) -> InputImage:
    """An image from its base64 text (standard or URL-safe alphabet, whitespace ignored)."""
    text = "".join(payload.split())
    if len(text) > (MAX_IMAGE_BYTES * 4) // 3 + 4:
        raise ImageError(_too_many_bytes(len(text) * 3 // 4))
    try:
        data = base64.b64decode(text.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError) as e:
        raise ImageError("the image is not valid base64") from e
    return decode_image(data)


def decode_image(data: bytes) -> InputImage:
    """Check and decode an image file's bytes: its first frame as RGB PNG."""
    if not data:
        raise ImageError("the image is empty")
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageError(_too_many_bytes(len(data)))
    try:
        with warnings.catch_warnings():
            # Pillow warns of canvases past its own limit; _checked refuses them (smaller).
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                return _checked(image, data)
    except ImageError:
        raise
    except Image.DecompressionBombError as e:
        raise ImageError(f"the image is too large: {e}") from e
    except UnidentifiedImageError as e:
        raise ImageError("the image cannot be read: not a PNG, JPEG, WebP or GIF file") from e
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        raise ImageError(f"the image cannot be read: {e}") from e


def _checked(image: Image.Image, data: bytes) -> InputImage:
    kind = image.format or "unknown"
    if kind not in FORMATS:
        raise ImageError(f"unsupported image format {kind}: send PNG, JPEG, WebP or GIF")
    width, height = image.size
    if width * height > MAX_IMAGE_PIXELS:
        raise ImageError(
            f"the image is too large: {width}x{height} pixels "
            f"(at most {MAX_IMAGE_PIXELS} pixels are accepted)"
        )
    image.seek(0)
    rgb = image.convert("RGB")  # decodes every pixel: a truncated file fails here
    digest = hashlib.sha256(f"{width}x{height}:".encode() + rgb.tobytes()).hexdigest()
    return InputImage(data=data, format=kind, width=width, height=height, sha256=digest)


def _too_many_bytes(size: int) -> str:
    return f"the image is too large: {size} bytes (at most {MAX_IMAGE_BYTES} are accepted)"


def decode_all(
    sources: Sequence[str], label: str, decode: Callable[[str], InputImage]
) -> list[InputImage]:
    """Decode each source, an error naming ``label`` and the image's index."""
    images: list[InputImage] = []
    for i, source in enumerate(sources):
        try:
            images.append(decode(source))
        except ImageError as e:
            raise ImageError(f"{label} {i}: {e}") from e
    return images


def to_pil(image: InputImage) -> Image.Image:
    """The image's first frame as Pillow RGB pixels (for a vision processor)."""
    with Image.open(io.BytesIO(image.data)) as file:
        return file.convert("RGB")


def openai_image_part(part: dict[str, object]) -> InputImage:
    """OpenAI chat's ``{"type": "image_url", "image_url": {"url": ...}}`` (a bare string
    ``image_url`` is taken too)."""
    field = part.get("image_url")
    url = field.get("url") if isinstance(field, dict) else field  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    if not isinstance(url, str):
        raise ImageError("needs 'image_url' with a string 'url'")
    return image_from_url(url)


def responses_image_part(part: dict[str, object]) -> InputImage:
    """Responses' ``{"type": "input_image", "image_url": ...}`` (file ids are not stored
    here)."""
    url = part.get("image_url")
    if isinstance(url, str):
        return image_from_url(url)
    if part.get("file_id") is not None:
        raise ImageError("file_id images are not supported here: send 'image_url'")
    raise ImageError("needs a string 'image_url'")
