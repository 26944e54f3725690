"""Writes the walk-through's data for the image classifier: held-out reference images and one
request body. Stand-ins: with your model, save real held-out inputs with numpy.save."""

import json
import sys
from pathlib import Path

import numpy as np

out = Path(sys.argv[1] if len(sys.argv) > 1 else "build/imagenet")
out.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(0)
# Smooth random images in [0, 1], 3x32x32, as a camera would send them (not normalised).
base = rng.random((300, 3, 4, 4)).repeat(8, axis=2).repeat(8, axis=3)
images = np.clip(base + 0.05 * rng.standard_normal(base.shape), 0, 1).astype(np.float32)
np.save(out / "reference.npy", images)
(out / "request.json").write_text(json.dumps({"data": images[0].tolist()}))
print(f"wrote {out}/reference.npy {images.shape} and {out}/request.json")
