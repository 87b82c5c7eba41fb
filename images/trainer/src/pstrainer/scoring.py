"""Evaluation metrics in plain numpy, so they are tested without TensorFlow."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def log_loss_and_auc(labels: npt.ArrayLike, logits: npt.ArrayLike) -> tuple[float, float]:
    """Mean log loss and ROC AUC (rank statistic) of predictions."""
    y = np.asarray(labels, dtype=np.float64)
    z = np.asarray(logits, dtype=np.float64)
    loss = float(np.mean(np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))))
    positives = int(y.sum())
    negatives = y.size - positives
    if positives == 0 or negatives == 0:
        return loss, float("nan")
    ranks = np.empty(y.size)
    ranks[np.argsort(z, kind="stable")] = np.arange(1, y.size + 1)
    auc = (ranks[y == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives)
    return loss, float(auc)
