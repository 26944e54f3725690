"""The text walk-through's model: sentence-transformers' all-MiniLM-L6-v2 (a 6-layer BERT with
384 hidden units, mean-pooled over its tokens and L2-normalised: a sentence embedding).

Built from a HuggingFace ``save_pretrained`` directory: ``pretrained`` names it, and
``hookwatch archive`` carries that directory (its config, weights and tokenizer) into the
archive. Needs ``transformers`` (``pip install 'hookwatch[text]'``).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import AutoModel
from transformers.utils import logging as hf_logging

# One progress bar per worker start is noise in TorchServe's log.
hf_logging.disable_progress_bar()


class SentenceEncoder(nn.Module):
    def __init__(self, pretrained: str) -> None:
        super().__init__()
        self.encoder = AutoModel.from_pretrained(pretrained, local_files_only=True)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        hidden = self.encoder(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state
        # Mean over the sentence's tokens, padding left out: sentence-transformers' pooling.
        weights = attention_mask[:, :, None].to(hidden.dtype)
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
        return nn.functional.normalize(pooled, dim=1)
