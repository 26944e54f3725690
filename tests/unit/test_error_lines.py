"""What a user reads of a model's own error: its cause, also from a TorchScript model (whose
interpreter opens every error with a line of its own)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hookwatch._errors import error_line
from hookwatch._service import _refused


class Picky(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x > 50).any()):
            raise ValueError("values over 50 are refused")
        return x


def test_a_torchscript_model_s_refusal_says_its_cause() -> None:
    scripted = torch.jit.script(Picky())
    with pytest.raises(Exception) as raised:
        scripted(torch.tensor([100.0]))
    assert str(raised.value).startswith("The following operation failed")  # torch's opening
    assert error_line(raised.value).endswith("values over 50 are refused")
    assert "values over 50 are refused" in _refused(raised.value).got


def test_other_errors_give_their_first_line() -> None:
    assert error_line(ValueError("first\nsecond")) == "first"
    assert error_line(ValueError("")) == ""
    assert _refused(IndexError("index 99 is out of range\nmore")).got == (
        "one it refused (IndexError: index 99 is out of range)"
    )
