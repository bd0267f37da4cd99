"""scikit-learn's handwritten digits (1797 8x8 images, shipped inside scikit-learn) and the fixed split."""

from __future__ import annotations

import torch

#: the held-out split: 25% of the samples, stratified by class, fixed seed
TEST_FRACTION, SPLIT_SEED = 0.25, 0


def load_split() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x_train, y_train, x_test, y_test)``; images ``[N, 1, 8, 8]`` float32 scaled to [0, 1]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    idx = torch.arange(len(y)).numpy()
    train, test = train_test_split(idx, test_size=TEST_FRACTION, random_state=SPLIT_SEED, stratify=digits.target)
    train, test = torch.as_tensor(train), torch.as_tensor(test)
    return x[train], y[train], x[test], y[test]
