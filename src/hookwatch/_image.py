"""Image files as a model's input (``input.encoding: image``): a JPEG, PNG, WebP, BMP, GIF or
TIFF body, decoded, oriented, converted, resized and cropped to ``input.shape``.

One function turns one file's bytes into one item, and serves requests and reference images
alike, so a profile sees exactly what serving feeds the model. Pillow is imported on first use:
it comes with TorchServe (the ``[torchserve]`` extra), and a model that takes no images never
needs it.

The geometry is the one image classifiers are evaluated with: the image is scaled, its aspect
kept, until it covers ``height x width``, then the centre is cropped (``Resize`` then
``CenterCrop``, for a square input). Values are the pixels over 255, in [0, 1], for a float
dtype; the bytes themselves for ``uint8``. ``input.mean``/``std`` normalise them afterwards.
"""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any

import numpy as np
import torch

from hookwatch._errors import BadInputError, ConfigError

__all__ = ["IMAGE_CHANNELS", "MAX_IMAGE_PIXELS", "decode_image", "image_bytes"]

#: Channels an image input may have, and the Pillow mode each is read in.
IMAGE_CHANNELS: dict[int, str] = {1: "L", 3: "RGB", 4: "RGBA"}
#: The most pixels an image may have before it is decoded (a 40-megapixel photo passes): a few
#: kilobytes of PNG can claim gigapixels, and the decoder would allocate them.
MAX_IMAGE_PIXELS = 50_000_000

_EXPECTED = "an image file (JPEG, PNG, WebP, BMP, GIF or TIFF)"


def _pillow() -> Any:
    try:
        from PIL import Image, ImageOps
    except ImportError:  # pragma: no cover - Pillow comes with torchserve
        raise ConfigError(
            "input.encoding: image needs Pillow (pip install pillow; it comes with "
            "hookwatch[torchserve]), got none installed"
        ) from None
    return Image, ImageOps


def image_bytes(value: Any) -> bytes | None:
    """A request's image as bytes: a body as TorchServe hands it over (bytes), or a JSON
    string holding the file base64-encoded, also as TF Serving's and KServe's clients send
    it (``{"b64": ...}``, in a batch of one). None for anything else (JSON numbers)."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | dict):
        value = value[0]  # `instances` of one
    if isinstance(value, dict) and len(value) == 1 and isinstance(value.get("b64"), str):
        value = value["b64"]
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, str):
        text = value
        if value.startswith("data:"):  # a data: URL: its header, a comma, the file
            header, comma, text = value.partition(",")
            if not comma or not header.endswith(";base64"):
                raise BadInputError(
                    "a data: URL of a base64 image (data:image/png;base64,...)",
                    "one without a comma" if not comma else f"one whose header is {header[:60]!r}",
                    reason="not_json",
                )
        # Line breaks are allowed, as base64 tools and MIME encoders wrap at 76 columns
        # (anything else outside the alphabet is still refused).
        text = text.translate(_LINE_BREAKS)
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise BadInputError(
                f"{_EXPECTED}, raw or as a base64 string",
                "a string that is not base64",
                reason="not_json",
            ) from None
    return None


#: What :func:`image_bytes` drops from a base64 string before it decodes it.
_LINE_BREAKS = str.maketrans("", "", "\r\n")


def decode_image(data: bytes, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """One image file → a tensor of ``shape`` (``[channels, height, width]``): float pixels
    over 255, or ``uint8`` bytes; raises :class:`BadInputError` for what is not an image."""
    image_module, image_ops = _pillow()
    channels, height, width = shape
    try:
        image = image_module.open(io.BytesIO(data))
    except image_module.DecompressionBombError:
        # Pillow's own refusal, at open, of an image claiming over twice its pixel limit.
        raise BadInputError(
            f"an image of at most {MAX_IMAGE_PIXELS:,} pixels",
            "far more",
            status=413,
            reason="too_large",
        ) from None
    except Exception as error:  # Pillow raises UnidentifiedImageError, OSError, ValueError...
        raise BadInputError(
            _EXPECTED,
            f"{len(data)} bytes that are not one ({type(error).__name__})",
            reason="not_json",
        ) from None
    with image:
        pixels = image.width * image.height
        if pixels > MAX_IMAGE_PIXELS:
            raise BadInputError(
                f"an image of at most {MAX_IMAGE_PIXELS:,} pixels",
                f"{image.width}x{image.height}",
                status=413,
                reason="too_large",
            )
        try:
            if image.format == "JPEG":
                # Decode at the smallest power-of-two scale that still covers the input: a
                # 12-megapixel photo for a 224x224 model is read at an eighth of its size.
                # Covering the input's longer side both ways: the EXIF turn comes after.
                side = max(width, height)
                image.draft(IMAGE_CHANNELS[channels], _cover(image.size, (side, side)))
            # A phone's photo stores its rotation apart from its pixels.
            image = image_ops.exif_transpose(image)
            image = _eight_bit(image, image_module).convert(IMAGE_CHANNELS[channels])
            image = _resize_crop(image, image_module, width, height)
            array = np.array(image, dtype=np.uint8)  # a copy the tensor may own
        except Exception as error:  # a truncated or corrupt file fails here, not at open
            raise BadInputError(
                _EXPECTED,
                f"an image that does not decode ({type(error).__name__}: {str(error)[:80]})",
                reason="not_json",
            ) from None
    if array.ndim == 2:
        array = array[:, :, None]
    tensor = torch.from_numpy(np.ascontiguousarray(array.transpose(2, 0, 1)))
    if dtype == torch.uint8:
        return tensor
    return tensor.to(torch.float32).div_(255.0).to(dtype)


#: Pillow's modes of one 16-bit (or 32-bit integer) channel, as a 16-bit PNG or TIFF opens.
_WIDE_GRAY = ("I;16", "I;16L", "I;16B", "I;16N", "I")


def _eight_bit(image: Any, image_module: Any) -> Any:
    """A 16-bit grayscale image in 8 bits, its range scaled (``value / 257``); other images as
    they are. Pillow's own conversion of these to ``L`` clips at 255, so a 16-bit scan
    would reach the model nearly all white."""
    if image.mode not in _WIDE_GRAY:
        return image
    wide = np.asarray(image, dtype=np.float64)
    narrow = np.clip(np.rint(wide / 257.0), 0, 255).astype(np.uint8)
    return image_module.fromarray(narrow)  # uint8, two dimensions: mode L


def _cover(size: tuple[int, int], target: tuple[int, int]) -> tuple[int, int]:
    """The size the image scales to so that it covers ``target``, aspect kept."""
    scale = max(target[0] / size[0], target[1] / size[1])
    return max(target[0], round(size[0] * scale)), max(target[1], round(size[1] * scale))


def _resize_crop(image: Any, image_module: Any, width: int, height: int) -> Any:
    if image.size != (width, height):
        covered = _cover(image.size, (width, height))
        if covered != image.size:
            image = image.resize(covered, image_module.Resampling.BILINEAR, reducing_gap=None)
        left = (image.width - width) // 2
        top = (image.height - height) // 2
        image = image.crop((left, top, left + width, top + height))
    return image
