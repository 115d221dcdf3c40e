"""Video classification with an MBT encoder (`config.task = "video_cls"`).

The supervised stage that pretrained encoders come from: VideoCC (§5.2)
initializes MBT from a ViT pretrained on ImageNet-21k with a multi-label
sigmoid loss; MBT and ViViT fine-tune on Kinetics with softmax. Here the same
MBT as the retrieval tasks gets a linear head (`models/heads.py`), and its
encoder is handed on with `config.init_from` (see `train/warm_start.py`).

Labels per clip come from the source: the synthetic world's ground-truth
attributes as a multi-hot vector over `synthetic.LABEL_NAMES`, or a dataset's
stored `label` field (an int class id, or a multi-hot vector of
`config.model.num_classes`).

Evaluation: logits averaged over the K equally spaced test clips of each video
(VideoCC §4.1's multi-clip protocol); mAP over classes with at least one
positive, and, where class names are `group:value` (the synthetic world),
mAP and accuracy per group. A group's accuracy counts the videos with exactly
one positive in the group: argmax over the group's logits is that positive.
"""
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from avtext.data import builders
from avtext.data import pipelines
from avtext.losses import classification as losses
from avtext.metrics import retrieval as retrieval_metrics
from avtext.models import heads
from avtext.tasks import registry
from avtext.tasks import retrieval


def label_names(config: ml_collections.ConfigDict) -> tuple[str, ...]:
  """Class names: the synthetic world's attribute labels, or class_0..class_{C-1}."""
  if config.dataset.name == "synthetic_clips":
    from avtext.data import synthetic  # pylint: disable=g-import-not-at-top
    return synthetic.LABEL_NAMES
  num = config.model.get("num_classes")
  if not num:
    raise ValueError(f"config.model.num_classes must be set for dataset "
                     f"{config.dataset.name!r} (its 'label' field's number of classes)")
  return tuple(f"class_{i}" for i in range(num))


class ClipLabels:
  """clip (from `pipelines.ClipReader.read`) -> float32 target [C]."""

  def __init__(self, num_classes: int):
    self.num_classes = num_classes

  def __call__(self, clip: dict) -> np.ndarray:
    if clip.get("attributes") is not None:
      from avtext.data import synthetic  # pylint: disable=g-import-not-at-top
      return synthetic.attribute_labels(clip["attributes"])
    label = clip.get("label")
    if label is None:
      raise ValueError("video_cls: the example has no labels; expected the synthetic world's "
                       "attributes or a 'label' field (int class id or multi-hot vector)")
    label = np.asarray(label)
    if label.ndim == 0:
      if not 0 <= int(label) < self.num_classes:
        raise ValueError(f"video_cls: label {int(label)} outside [0, {self.num_classes}) "
                         "(config.model.num_classes)")
      return np.eye(self.num_classes, dtype=np.float32)[int(label)]
    if label.shape != (self.num_classes,):
      raise ValueError(f"video_cls: multi-hot label of shape {label.shape}, expected "
                       f"({self.num_classes},) (config.model.num_classes)")
    return label.astype(np.float32)


@registry.register("video_cls")
class VideoClassificationTask(registry.ClipTask):
  """MBT + linear head, sigmoid (multi-label) or softmax cross-entropy."""

  def __init__(self, config: ml_collections.ConfigDict):
    if config.loss.name not in losses.LOSSES:
      raise ValueError(f"config.loss.name={config.loss.name!r}; video_cls expects one of "
                       f"{sorted(losses.LOSSES)}")
    self.label_names = label_names(config)
    super().__init__(config, heads.VideoClassifier(
        video=retrieval.build_video_encoder(config.model.video),
        num_classes=len(self.label_names)))
    self._predict_cache = (None, None)  # (mesh, jitted predictor), see _predict_fn

  def examples(self, source, *, train: bool) -> pipelines.ClipExamples:
    return pipelines.ClipExamples(pipelines.ClipReader(source), self.config.data, train=train,
                                  label_fn=ClipLabels(len(self.label_names)))

  def init_params(self, rng, batch):
    return self._model.init({"params": rng}, retrieval.video_inputs(batch))["params"]

  def loss_fn(self, params, batch, rng):
    logits = self._model.apply({"params": params}, retrieval.video_inputs(batch), train=True,
                               rngs={"dropout": rng})
    labels = batch["labels"]
    loss = losses.LOSSES[self.config.loss.name](logits, labels)
    if self.config.loss.name == "sigmoid_xent":  # per-label decisions at p = 0.5
      return loss, {"label_accuracy": 100.0 * jnp.mean((logits > 0) == (labels > 0.5))}
    return loss, {"top1_accuracy": 100.0 * jnp.mean(
        jnp.argmax(logits, -1) == jnp.argmax(labels, -1))}

  # ---- evaluation ---------------------------------------------------------

  def _predict_fn(self, mesh):
    """jit(params, batch) -> (logits [B, C] averaged over K clips, labels [B, C])."""
    if self._predict_cache[0] is not mesh:
      model = self._model

      def predict(params, batch):
        b, k = batch["rgb"].shape[:2]
        flat = jax.tree.map(lambda x: x.reshape((b * k,) + x.shape[2:]),
                            retrieval.video_inputs(batch))
        logits = model.apply({"params": params}, flat).reshape(b, k, -1)
        return jnp.mean(logits, axis=1), batch["labels"]

      self._predict_cache = (mesh, jax.jit(predict))
    return self._predict_cache[1]

  def predict(self, params, source, *, mesh) -> tuple[np.ndarray, np.ndarray]:
    """(logits [N, C], labels [N, C]) of every video of `source`."""
    predict = self._predict_fn(mesh)
    return registry.map_examples(
        lambda batch: predict(params, batch), self.examples(source, train=False), len(source),
        mesh=mesh, global_batch_size=self.config.eval.batch_size)

  def evaluate(self, params, *, mesh, workdir, step) -> dict[str, float]:
    config = self.config
    source = builders.clip_source(config.dataset, config.dataset.eval_split,
                                  name=config.dataset.eval_name)
    logits, labels = self.predict(params, source, mesh=mesh)
    results = classification_metrics(logits, labels, self.label_names)
    results["num_videos"] = len(labels)
    _print_table(results, step)
    return results


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


def _print_table(results: dict, step: int) -> None:
  lines = [f"== video classification, step {step}, {results['num_videos']} videos ==",
           f"mAP {results['mAP']:6.2f}" + (f"   top-1 {results['top1_accuracy']:6.2f}"
                                            if "top1_accuracy" in results else "")]
  for key in sorted(k for k in results if k.endswith("_accuracy") and k != "top1_accuracy"):
    group = key[:-len("_accuracy")]
    lines.append(f"  {group:<11} accuracy {results[key]:6.2f}   mAP {results[group + '_mAP']:6.2f}")
  print("\n".join(lines), flush=True)
