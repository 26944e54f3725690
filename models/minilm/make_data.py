"""Writes the text walk-through's data: reference texts as request bodies (a JSON string per
line), from one half of the `computers` category of Debian's fortunes, and one request."""

import json
import sys
from pathlib import Path

from hookwatch.tools.text.fortunes import read_category, split_texts

out = Path(sys.argv[1] if len(sys.argv) > 1 else "build/minilm")
out.mkdir(parents=True, exist_ok=True)
split = split_texts(read_category("computers"))
with (out / "reference.jsonl").open("w") as f:
    for text in split.reference:
        f.write(json.dumps(text) + "\n")
(out / "request.json").write_text(json.dumps(split.held_out[0]))
print(f"wrote {out}/reference.jsonl ({len(split.reference)} texts) and {out}/request.json")
