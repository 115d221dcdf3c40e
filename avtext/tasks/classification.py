"""Video classification with an MBT encoder (`config.task = "video_cls"`).

The supervised stage that pretrained encoders come from: VideoCC (§5.2)
initializes MBT from a ViT pretrained on ImageNet-21k with a multi-label
sigmoid loss; MBT and ViViT fine-tune on Kinetics with softmax. Here the same
MBT as the retrieval tasks gets a linear head (`models/heads.py`), and its
encoder is handed on with `config.init_from` (see `train/warm_start.py`).

Labels per clip come from the dataset: where it declares ground truth
(`avtext.data.ground_truth.of_dataset`, e.g. the synthetic world), its clips'
attributes as a multi-hot vector over the truth's `label_names`; otherwise a
stored `label` field (an int class id, or a multi-hot vector of
`config.model.num_classes`).

Evaluation is the `classification` evaluator (`avtext/evals/classification.py`)
over the predict function `logits` ([B, K, C], one row per test clip) and the
batch's `labels`; `label_names` gives it the class names.
"""
import functools

import jax.numpy as jnp
import ml_collections
import numpy as np

from avtext.data import ground_truth
from avtext.data import pipelines
from avtext.losses import classification as losses
from avtext.modalities import parse_modalities
from avtext.tasks import task_registry


def label_names(config: ml_collections.ConfigDict) -> tuple[str, ...]:
  """Class names: the attribute labels of the dataset's ground truth, or
  class_0..class_{C-1}."""
  truth = ground_truth.of_dataset(config.dataset)
  if truth is not None:
    return tuple(truth.label_names)
  num = config.model.get("num_classes")
  if not num:
    raise ValueError(f"config.model.num_classes must be set for dataset "
                     f"{config.dataset.name!r} (its 'label' field's number of classes)")
  return tuple(f"class_{i}" for i in range(num))


class ClipLabels:
  """clip (from `pipelines.ClipReader.read`) -> float32 target [C]: `truth.labels` of its
  attributes with a `ground_truth.ClipTruth`, else its 'label' field."""

  def __init__(self, num_classes: int, truth: ground_truth.ClipTruth | None = None):
    self.num_classes = num_classes
    self.truth = truth

  def __call__(self, clip: dict) -> np.ndarray:
    if self.truth is not None and clip.get("attributes") is not None:
      return self.truth.labels(clip["attributes"])
    label = clip.get("label")
    if label is None:
      raise ValueError("video_cls: the example has no labels; expected ground-truth "
                       "attributes (a dataset that declares them, avtext.data.ground_truth) "
                       "or a 'label' field (int class id or multi-hot vector)")
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


def label_groups(names: tuple[str, ...]) -> dict[str, list[int]]:
  """{group: its class indices} of "group:value" class names, in order of appearance."""
  groups: dict[str, list[int]] = {}
  for i, name in enumerate(names):
    if ":" not in name:
      raise ValueError(f"config.loss.name='group_softmax_xent' needs class names "
                       f"'group:value'; class {i} is {name!r}")
    groups.setdefault(name.split(":", 1)[0], []).append(i)
  return groups


def group_loss(cfg: ml_collections.ConfigDict, names: tuple[str, ...]):
  """`losses.group_softmax_cross_entropy` over the "group:value" classes of `names`, with
  `cfg.group_weights` ({group: weight}, 1 where unset) and `cfg.focal_gamma` (0 if unset)."""
  groups = label_groups(names)
  weights = dict(cfg.get("group_weights") or {})
  unknown = sorted(set(weights) - set(groups))
  if unknown:
    raise ValueError(f"config.loss.group_weights names {unknown}, not label groups; "
                     f"the groups are {sorted(groups)}")
  cols = list(groups.values())
  w = [float(weights.get(g, 1.0)) for g in groups]
  gamma = float(cfg.get("focal_gamma") or 0.0)
  return functools.partial(losses.group_softmax_cross_entropy, groups=cols, weights=w,
                           focal_gamma=gamma)


@task_registry.register("video_cls")
class VideoClassificationTask(task_registry.ClipTask):
  """MBT + linear head (`config.model.name = "video_classifier"`); sigmoid, softmax or
  per-group softmax xent (`config.loss.group_weights`, `config.loss.focal_gamma`)."""

  def __init__(self, config: ml_collections.ConfigDict):
    if config.loss.name not in losses.LOSSES:
      raise ValueError(f"config.loss.name={config.loss.name!r}; video_cls expects one of "
                       f"{sorted(losses.LOSSES)}")
    self.label_names = label_names(config)
    self._truth = ground_truth.of_dataset(config.dataset)
    if config.model.get("num_classes") != len(self.label_names):
      raise ValueError(f"config.model.num_classes={config.model.get('num_classes')}, but "
                       f"dataset {config.dataset.name!r} has {len(self.label_names)} labels")
    super().__init__(config)
    self.modalities = parse_modalities(config.model.video.modalities)
    self._loss = losses.LOSSES[config.loss.name]
    if config.loss.name == "group_softmax_xent":
      self._loss = group_loss(config.loss, self.label_names)
      self._groups = list(label_groups(self.label_names).values())

  def examples(self, source, *, train: bool) -> pipelines.ClipExamples:
    return pipelines.ClipExamples(pipelines.ClipReader(source), self.config.data, train=train,
                                  label_fn=ClipLabels(len(self.label_names), self._truth),
                                  modalities=self.modalities)

  def example_spec(self, *, train: bool):
    """`clip_spec` (eval: a K = eval_num_clips axis) + labels float32 [num classes]
    (no K axis; the evaluator reads them from the batch)."""
    return {**self.clip_spec(train=train),
            "labels": task_registry.spec((len(self.label_names),), "float32")}

  def init_variables(self, rng, batch):
    return self.model.init({"params": rng}, task_registry.video_inputs(batch))

  def loss_fn(self, variables, batch, rng):
    logits = self.model.apply(variables, task_registry.video_inputs(batch), train=True,
                              rngs={"dropout": rng})
    labels = batch["labels"]
    loss = self._loss(logits, labels)
    if self.config.loss.name == "sigmoid_xent":  # per-label decisions at p = 0.5
      return loss, {"label_accuracy": 100.0 * jnp.mean((logits > 0) == (labels > 0.5))}, {}
    if self.config.loss.name == "group_softmax_xent":  # each group's argmax is a positive
      hits = [jnp.take_along_axis(labels[:, c], jnp.argmax(logits[:, c], -1)[:, None], -1)
              for c in self._groups]
      return loss, {"group_accuracy": 100.0 * jnp.mean(jnp.concatenate(hits) > 0.5)}, {}
    return loss, {"top1_accuracy": 100.0 * jnp.mean(
        jnp.argmax(logits, -1) == jnp.argmax(labels, -1))}, {}

  def predict_fns(self):
    model = self.model

    def logits(variables, batch):  # [B, K, C]: every test clip of every video
      return task_registry.fold_clips(lambda x: model.apply(variables, x),
                                      task_registry.video_inputs(batch))

    return {"logits": logits}
