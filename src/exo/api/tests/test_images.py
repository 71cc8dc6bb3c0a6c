"""Decoding images: the formats read, and a clear error for each image that is not."""

import base64
import io
import struct
import zlib

import pytest
from PIL import Image

from exo.api.images import (
    MAX_IMAGE_BYTES,
    ImageError,
    decode_image,
    image_from_base64,
    image_from_url,
    to_pil,
)


def image_bytes(fmt: str, size: tuple[int, int] = (5, 3), color: int = 40) -> bytes:
    image = Image.new("RGB", size, (color, 100, 200))
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


def bomb_png(width: int, height: int) -> bytes:
    """A tiny PNG whose header claims a ``width`` x ``height`` canvas."""
    png = image_bytes("PNG", (1, 1))
    # The IHDR chunk: 8-byte signature, length, type, then width and height.
    header = png[12:16] + struct.pack(">II", width, height) + png[24:29]
    crc = struct.pack(">I", zlib.crc32(header) & 0xFFFFFFFF)
    return png[:12] + header + crc + png[33:]


def data_url(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF"])
def test_each_format_decodes_to_rgb_png(fmt: str) -> None:
    image = decode_image(image_bytes(fmt))
    assert (image.width, image.height) == (5, 3)
    pixels = to_pil(image)
    assert pixels.mode == "RGB" and pixels.size == (5, 3)
    assert image.format == fmt and image.data == image_bytes(fmt)  # the file as sent


def test_a_gif_gives_its_first_frame() -> None:
    frames = [Image.new("RGB", (4, 4), c) for c in ((255, 0, 0), (0, 0, 255))]
    out = io.BytesIO()
    frames[0].save(out, format="GIF", save_all=True, append_images=frames[1:])
    first = to_pil(decode_image(out.getvalue())).getpixel((0, 0))
    assert first == (255, 0, 0)


def test_one_pixel_changes_the_hash() -> None:
    a = Image.new("RGB", (8, 8), (10, 10, 10))
    b = a.copy()
    b.putpixel((7, 7), (10, 10, 11))
    hashes: list[str] = []
    for im in (a, b):
        out = io.BytesIO()
        im.save(out, format="PNG")
        hashes.append(decode_image(out.getvalue()).sha256)
    assert hashes[0] != hashes[1]
    # The same pixels in another format hash the same.
    out = io.BytesIO()
    a.save(out, format="WEBP", lossless=True)
    assert decode_image(out.getvalue()).sha256 == hashes[0]


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"", "empty"),
        (b"not an image at all", "cannot be read"),
        (image_bytes("PNG")[:40], "cannot be read"),
        (image_bytes("BMP"), "unsupported image format BMP"),
        (bomb_png(8000, 8000), "8000x8000 pixels"),
        (bomb_png(20000, 20000), "too large"),
    ],
)
def test_bad_images_are_refused_with_a_reason(data: bytes, words: str) -> None:
    with pytest.raises(ImageError, match=words):
        decode_image(data)


def test_oversized_bytes_are_refused_before_decoding() -> None:
    with pytest.raises(ImageError, match="too large"):
        decode_image(b"\0" * (MAX_IMAGE_BYTES + 1))
    with pytest.raises(ImageError, match="too large"):
        image_from_base64("A" * (MAX_IMAGE_BYTES * 2))


def test_urls() -> None:
    png = image_bytes("PNG")
    assert image_from_url(data_url(png)).width == 5
    with pytest.raises(ImageError, match="not fetched"):
        image_from_url("https://example.com/cat.png")
    with pytest.raises(ImageError, match="unsupported image type"):
        image_from_url(data_url(png, "image/tiff"))
    with pytest.raises(ImageError, match="base64"):
        image_from_url("data:image/png,rawbytes")
    with pytest.raises(ImageError, match="not valid base64"):
        image_from_url("data:image/png;base64,@@@@")
    with pytest.raises(ImageError, match="data: URL"):
        image_from_url("ftp://x/y.png")
