"""A small transformer-like encoder for tests (no downloads): BERT's module layout, its
keyword-argument forward and its dict output, at a size that runs in milliseconds.

Attention respects the mask, so a sentence's hidden states do not depend on how much padding
its batch adds: what token-aware statistics must then reproduce.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from pathlib import Path

import torch
from torch import nn

VOCAB = 40
PAD = 0
CLS = 1
SEP = 2


class Attention(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)

    def forward(
        self, hidden: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        scores = self.query(hidden) @ self.key(hidden).transpose(1, 2) / math.sqrt(hidden.shape[2])
        scores = scores.masked_fill(~mask[:, None, :], float("-inf"))
        weights = scores.softmax(dim=-1)
        # A tuple, as BERT's attention returns (output, weights).
        return weights @ self.value(hidden), weights


class Output(nn.Module):
    """BERT's ``layer.N.output``: dense, residual, LayerNorm; a [B, T, H] tensor."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.LayerNorm = nn.LayerNorm(hidden)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.LayerNorm(torch.relu(self.dense(hidden)) + residual)
        return out


class Layer(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.attention = Attention(hidden)
        self.output = Output(hidden)

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor]:
        attended, _ = self.attention(hidden, mask)
        return (self.output(attended, hidden),)


class Encoder(nn.Module):
    def __init__(self, hidden: int, layers: int) -> None:
        super().__init__()
        self.layer = nn.ModuleList(Layer(hidden) for _ in range(layers))


class TinyEncoder(nn.Module):
    """``forward(input_ids=..., attention_mask=...)`` → a dict like a ``ModelOutput``."""

    def __init__(self, hidden: int = 8, layers: int = 2, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embeddings = nn.Embedding(VOCAB, hidden)
        self.position = nn.Embedding(64, hidden)
        self.encoder = Encoder(hidden, layers)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        mask = attention_mask.bool()
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        hidden = self.embeddings(input_ids) + self.position(positions)[None]
        for layer in self.encoder.layer:
            hidden = layer(hidden, mask)[0]
        weights = mask[:, :, None].float()
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)
        return OrderedDict(last_hidden_state=hidden, pooler_output=pooled)


def encode(sentences: list[list[int]]) -> dict[str, torch.Tensor]:
    """Token ids (CLS, ids, SEP), right-padded to the longest, and their attention mask."""
    rows = [[CLS, *s, SEP] for s in sentences]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [PAD] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return {"input_ids": ids, "attention_mask": mask}


def sentences(count: int, seed: int = 0, low: int = 3, high: int = 12) -> list[list[int]]:
    """Random sentences of ``low`` to ``high`` tokens over the vocabulary (specials aside)."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high + 1, (count,), generator=generator).tolist()
    return [torch.randint(3, VOCAB, (n,), generator=generator).tolist() for n in lengths]


#: The tiny tokenizer's words: token id = 3 + index (0-2 are PAD, CLS, SEP; UNK is 3).
WORDS = [f"w{i}" for i in range(VOCAB - 4)]


def save_tokenizer(directory: Path) -> Path:
    """A word-level HuggingFace tokenizer for :class:`TinyEncoder`, saved as
    ``save_pretrained`` writes one (no download): words ``w0``..``w35``, CLS/SEP added."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": PAD, "[CLS]": CLS, "[SEP]": SEP, "[UNK]": 3}
    vocab.update({word: 4 + i for i, word in enumerate(WORDS)})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", CLS), ("[SEP]", SEP)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        unk_token="[UNK]",
        model_max_length=512,
    )
    fast.save_pretrained(str(directory))
    return directory


def words(count: int, seed: int = 0, low: int = 3, high: int = 12) -> list[str]:
    """Random texts over the tiny tokenizer's words."""
    return [
        " ".join(WORDS[t - 4] for t in s if t >= 4) or WORDS[0]
        for s in sentences(count, seed, low, high)
    ]
