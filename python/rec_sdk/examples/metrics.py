"""Evaluation metrics computed in NumPy (no TensorFlow streaming state)."""

import numpy as np


def auc(labels, scores):
    """Area under the ROC curve by the rank-sum formula; ties get their average rank."""
    labels = np.asarray(labels).astype(bool).ravel()
    scores = np.asarray(scores, dtype=np.float64).ravel()
    positives = int(labels.sum())
    negatives = labels.size - positives
    if positives == 0 or negatives == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    ranks = np.empty(scores.size, dtype=np.float64)
    # Average rank over runs of equal scores.
    boundaries = np.flatnonzero(np.diff(sorted_scores)) + 1
    starts = np.concatenate([[0], boundaries])
    ends = np.concatenate([boundaries, [scores.size]])
    for start, end in zip(starts, ends):
        ranks[order[start:end]] = (start + end + 1) / 2.0
    return float(
        (ranks[labels].sum() - positives * (positives + 1) / 2.0) / (positives * negatives)
    )


def log_loss(labels, probabilities, eps=1e-7):
    labels = np.asarray(labels, dtype=np.float64).ravel()
    p = np.clip(np.asarray(probabilities, dtype=np.float64).ravel(), eps, 1 - eps)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))
