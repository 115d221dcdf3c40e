"""Classification metrics: mAP over classes, top-1, and per-group mAP/accuracy.

Host-side numpy. `logits  # [N, C]` scores every video for every class;
`labels  # [N, C]` are multi-hot (or one-hot) targets. mAP is over classes
with at least one positive (AP is undefined without one), with the
pessimistic tie handling of `retrieval.mean_average_precision`. Where class
names are `group:value` (the synthetic world's attributes), mAP and accuracy
are also reported per group; a group's accuracy counts the videos with exactly
one positive in the group: argmax over the group's logits is that positive.
"""
from typing import Any

import numpy as np

from avtext.metrics import retrieval as retrieval_metrics


def classification_metrics(logits: np.ndarray, labels: np.ndarray,
                           names: tuple[str, ...]) -> dict[str, Any]:
  """mAP over classes; top-1 accuracy for single-label data; per-group mAP/accuracy."""
  labels = np.asarray(labels) > 0.5
  out: dict[str, Any] = {}

  def class_map(cols) -> float:
    cols = [c for c in cols if labels[:, c].any()]  # AP is undefined without a positive
    return retrieval_metrics.mean_average_precision(logits[:, cols].T, labels[:, cols].T)

  out["mAP"] = class_map(range(len(names)))
  out["classes_without_positives"] = int((~labels.any(axis=0)).sum())
  if (labels.sum(axis=1) == 1).all():
    out["top1_accuracy"] = 100.0 * float(np.mean(labels[np.arange(len(labels)),
                                                        logits.argmax(axis=1)]))
  groups: dict[str, list[int]] = {}
  for i, name in enumerate(names):
    if ":" in name:
      groups.setdefault(name.split(":", 1)[0], []).append(i)
  for group, cols in groups.items():
    out[f"{group}_mAP"] = class_map(cols)
    single = labels[:, cols].sum(axis=1) == 1
    if single.any():
      hit = labels[:, cols][single][np.arange(single.sum()), logits[:, cols][single].argmax(1)]
      out[f"{group}_accuracy"] = 100.0 * float(np.mean(hit))
  return out
