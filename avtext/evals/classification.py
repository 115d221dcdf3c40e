"""Video classification evaluator (`type="classification"`).

Config fields (besides `base.Evaluator`'s):
  logits_fn   predict function giving class scores, [B, K, C] over K test clips
              or [B, C] (default "logits")
  label_key   the batch's multi-hot / one-hot targets [B, C] (default "labels")

Logits are averaged over the K equally spaced test clips of each video
(VideoCC §4.1's multi-clip protocol), then scored by
`avtext.metrics.classification.classification_metrics` with the task's
`label_names` (class_0.. when they are empty).
"""
from typing import Any

import jax.numpy as jnp

from avtext import evals
from avtext.evals import base
from avtext.evals import protocols
from avtext.metrics import classification as metrics


@evals.register_evaluator("classification")
class ClassificationEvaluator(base.Evaluator):
  """mAP, top-1 and per-group accuracy of the task's logits."""

  protocol = protocols.Classification
  predict_fn_keys = {"logits_fn": "logits"}

  def evaluate(self, variables, *, mesh, step: int) -> dict[str, Any]:
    del step
    logits_fn = self.cache.predict_fn(self.predict_fn_name("logits_fn"))
    label_key = self.cfg.get("label_key", "labels")

    def build():
      def predict(v, batch):
        logits = logits_fn(v, batch)
        if logits.ndim == 3:  # [B, K, C]: average the K clips
          logits = jnp.mean(logits, axis=1)
        return {"logits": logits, "labels": batch[label_key]}
      return predict

    out, _ = self.predict(("classification", logits_fn, label_key), build, variables,
                          mesh=mesh)
    names = self.task.label_names or tuple(
        f"class_{i}" for i in range(out["logits"].shape[1]))
    results = metrics.classification_metrics(out["logits"], out["labels"], names)
    results["num_videos"] = len(out["labels"])
    return results

  def report(self, results: dict, step: int) -> None:
    lines = [f"== {self.name}: video classification, step {step}, "
             f"{results['num_videos']} videos ==",
             f"mAP {results['mAP']:6.2f}" + (f"   top-1 {results['top1_accuracy']:6.2f}"
                                              if "top1_accuracy" in results else "")]
    for key in sorted(k for k in results if k.endswith("_accuracy") and k != "top1_accuracy"):
      group = key[:-len("_accuracy")]
      lines.append(f"  {group:<11} accuracy {results[key]:6.2f}   "
                   f"mAP {results[group + '_mAP']:6.2f}")
    print("\n".join(lines), flush=True)
