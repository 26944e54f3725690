"""Writes the walk-through's data for the image classifier: a directory of held-out reference
images and one request image. Stand-ins: with your model, point --reference at a directory of
real held-out images (or save decoded inputs with numpy.save)."""

import sys
from pathlib import Path

import numpy as np
from PIL import Image

out = Path(sys.argv[1] if len(sys.argv) > 1 else "build/imagenet")
(out / "reference").mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(0)


def photo(height: int, width: int) -> Image.Image:
    """Smooth random colours with a little noise, as a camera's image is smooth."""
    base = rng.random((height // 8, width // 8, 3)).repeat(8, axis=0).repeat(8, axis=1)
    pixels = np.clip(base + 0.05 * rng.standard_normal(base.shape), 0, 1)
    return Image.fromarray((pixels * 255).round().astype(np.uint8))


# Larger than the model's 32x32 and not square: hookwatch scales each image, aspect kept, until
# it covers 32x32 and crops the centre, for the reference as for every request.
for i in range(300):
    photo(48, 64).save(out / "reference" / f"{i:03}.png")
photo(48, 64).save(out / "request.jpg", quality=90)
print(f"wrote 300 images in {out}/reference and {out}/request.jpg")
