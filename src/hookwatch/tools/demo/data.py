"""The digits data shipped with scikit-learn, split the same way everywhere."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


@dataclass(frozen=True)
class DigitsSplit:
    x_train: NDArray[np.float32]  # [N, 1, 8, 8], pixel values 0..16
    y_train: NDArray[np.int64]
    x_test: NDArray[np.float32]
    y_test: NDArray[np.int64]


def load_split(seed: int = 0, test_size: float = 0.3) -> DigitsSplit:
    digits = load_digits()
    x = digits.images.astype(np.float32)[:, None, :, :]
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=test_size, random_state=seed, stratify=y
    )
    return DigitsSplit(x_train, y_train, x_test, y_test)
