"""Shifted versions of the held-out digits, each a pool windows are drawn from.

Pixel values stay in the served input range 0..16 (the handler rejects anything else), so every
scenario is traffic the real server would accept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from scipy import ndimage

Images = NDArray[np.float32]
FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    #: Images of the pool ``[P, 1, 8, 8]``.
    images: Images
    #: The digit each pool image shows; None where no answer is right (not a digit at all).
    labels: NDArray[np.int64] | None
    #: Sampling weight of each pool image (None: uniform); the class-prior shift uses it.
    weights: NDArray[np.float64] | None = None
    drifted: bool = True


def _clip(x: NDArray[np.floating] | NDArray[np.float64]) -> Images:
    clipped: Images = np.clip(x, 0.0, 16.0).astype(np.float32)
    return clipped


def _per_image(x: Images, fn: Callable[[NDArray[np.float32]], NDArray[np.floating]]) -> Images:
    return _clip(np.stack([fn(img[0])[None] for img in x]))


def gaussian_noise(x: Images, sigma: float, seed: int) -> Images:
    rng = np.random.default_rng(seed)
    return _clip(x + rng.normal(0.0, sigma, size=x.shape))


def blur(x: Images, sigma: float) -> Images:
    return _per_image(x, lambda img: ndimage.gaussian_filter(img, sigma, mode="constant"))


def rotate(x: Images, degrees: float) -> Images:
    return _per_image(
        x, lambda img: ndimage.rotate(img, degrees, reshape=False, order=1, mode="constant")
    )


def brightness(x: Images, delta: float) -> Images:
    return _clip(x + delta)


def contrast(x: Images, factor: float) -> Images:
    return _clip((x - 8.0) * factor + 8.0)


def invert(x: Images) -> Images:
    return _clip(16.0 - x)


def prior_shift(
    labels: NDArray[np.int64], favoured: tuple[int, ...], boost: float
) -> NDArray[np.float64]:
    """Weights that make the ``favoured`` classes ``boost`` times as frequent as the rest."""
    w = np.where(np.isin(labels, favoured), boost, 1.0)
    result: NDArray[np.float64] = w / w.sum()
    return result


def letters(count: int, seed: int, font_dir: Path = FONT_DIR) -> Images:
    """Capital letters rendered with the system's DejaVu fonts, scaled to 8x8 like the digits."""
    from PIL import Image, ImageDraw, ImageFont

    fonts = sorted(
        p
        for p in font_dir.glob("DejaVu*.ttf")
        if "Math" not in p.name and "ExtraLight" not in p.name
    )
    if not fonts:
        raise FileNotFoundError(f"expected DejaVu fonts in {font_dir} (Debian fonts-dejavu-core)")
    rng = np.random.default_rng(seed)
    alphabet = "ABCDEFGHJKLMNPQRTUVWXYZ"  # no I, O, S: they are digits in disguise
    images = []
    for i in range(count):
        font = ImageFont.truetype(str(fonts[i % len(fonts)]), size=int(rng.integers(26, 34)))
        char = alphabet[int(rng.integers(len(alphabet)))]
        canvas = Image.new("L", (32, 32), 0)
        draw = ImageDraw.Draw(canvas)
        left, top, right, bottom = draw.textbbox((0, 0), char, font=font)
        dx = int(rng.integers(-2, 3))
        dy = int(rng.integers(-2, 3))
        draw.text(
            ((32 - (right - left)) / 2 - left + dx, (32 - (bottom - top)) / 2 - top + dy),
            char,
            fill=255,
            font=font,
        )
        # Like the digits: 32x32 binary bitmaps averaged over 4x4 blocks give 0..16.
        bitmap = (np.asarray(canvas, dtype=np.float32) > 127).astype(np.float32)
        small = bitmap.reshape(8, 4, 8, 4).sum(axis=(1, 3))
        images.append(small[None])
    return np.stack(images).astype(np.float32)


def build_scenarios(x_test: Images, y_test: NDArray[np.int64], seed: int = 0) -> list[Scenario]:
    y = y_test
    return [
        Scenario("clean", "held-out digits, no change", x_test, y, drifted=False),
        Scenario(
            "noise-low",
            "Gaussian pixel noise, sigma 1 (of 16)",
            gaussian_noise(x_test, 1.0, seed),
            y,
        ),
        Scenario(
            "noise-mid", "Gaussian pixel noise, sigma 2", gaussian_noise(x_test, 2.0, seed + 1), y
        ),
        Scenario(
            "noise-high",
            "Gaussian pixel noise, sigma 4",
            gaussian_noise(x_test, 4.0, seed + 2),
            y,
        ),
        Scenario("blur", "Gaussian blur, sigma 0.6 px", blur(x_test, 0.6), y),
        Scenario("rotate-15", "rotation by 15 degrees", rotate(x_test, 15.0), y),
        Scenario("rotate-30", "rotation by 30 degrees", rotate(x_test, 30.0), y),
        Scenario("rotate-45", "rotation by 45 degrees", rotate(x_test, 45.0), y),
        Scenario("brightness", "brightness +2 (of 16), clipped", brightness(x_test, 2.0), y),
        Scenario("contrast", "contrast x0.6 around mid-grey", contrast(x_test, 0.6), y),
        Scenario("invert", "inverted images (16 - x)", invert(x_test), y),
        Scenario(
            "prior-shift",
            "digits 0-2 three times as frequent",
            x_test,
            y,
            weights=prior_shift(y_test, (0, 1, 2), 3.0),
        ),
        Scenario(
            "letters",
            "out of distribution: DejaVu capital letters (no answer is right)",
            letters(len(x_test), seed),
            None,
        ),
    ]
