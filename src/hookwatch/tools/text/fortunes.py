"""Texts from Debian's ``fortunes`` package: about 40 categories of short texts, one file
each in ``/usr/share/games/fortunes/`` with the texts separated by ``%`` lines.

The text demo's reference and traffic come from one category (``computers``) and its shifted
traffic from another (``literature``), or a mix.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

from hookwatch._errors import ConfigError

__all__ = ["FORTUNES", "TextSplit", "read_category", "split_texts"]

FORTUNES = Path("/usr/share/games/fortunes")
#: Longest text kept, in characters: comfortably inside the demo's 256-token limit.
MAX_CHARS = 600
#: A character followed by a backspace: the old terminals' bold and underline.
_OVERSTRIKE = re.compile(r".\x08")


def read_category(name: str, directory: Path = FORTUNES, max_chars: int = MAX_CHARS) -> list[str]:
    """The texts of one category, in file order, overstrikes removed, at most ``max_chars``."""
    path = directory / name
    if not path.is_file():
        raise ConfigError(
            f"fortunes: expected the category file {path}, got no such file "
            "(apt-get install fortunes; `make deps` does)"
        )
    raw = path.read_bytes().decode("utf-8", errors="replace")
    texts = []
    for block in re.split(r"^%\s*$", raw, flags=re.M):
        text = _OVERSTRIKE.sub("", block).strip("\n")
        if text.strip() and len(text) <= max_chars:
            texts.append(text)
    return texts


@dataclass(frozen=True)
class TextSplit:
    """One category split at random: reference (the profile) and held-out (clean traffic)."""

    reference: list[str]
    held_out: list[str]


def split_texts(texts: list[str], reference_share: float = 0.5, seed: int = 0) -> TextSplit:
    order = list(texts)
    random.Random(seed).shuffle(order)
    cut = int(len(order) * reference_share)
    return TextSplit(order[:cut], order[cut:])
