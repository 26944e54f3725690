"""Writes the walk-through's data for the regression MLP: held-out reference rows as request
bodies (one JSON body per line) and one request body. Stand-ins for real held-out data."""

import json
import sys
from pathlib import Path

import numpy as np

out = Path(sys.argv[1] if len(sys.argv) > 1 else "build/regression")
out.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(0)
rows = rng.normal(loc=[0, 1, 2, 3, 0, 0, -1, 5], scale=1.0, size=(400, 8)).round(4)
with (out / "reference.jsonl").open("w") as f:
    for row in rows:
        f.write(json.dumps({"data": row.tolist()}) + "\n")
(out / "request.json").write_text(json.dumps({"data": rows[0].tolist()}))
print(f"wrote {out}/reference.jsonl ({len(rows)} bodies) and {out}/request.json")
