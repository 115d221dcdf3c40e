"""video_cls: losses, labels and metrics by hand; the task trains and evaluates."""
import json
import math

import numpy as np
import optax
import pytest

from avtext import experiment
from avtext.data import ground_truth
from avtext.losses import classification as losses
from avtext.metrics import classification as classification_metrics
from avtext.tasks import classification
import avworld as synthetic
from configs import synthetic_video_pretrain  # pylint: disable=g-bad-import-order
from tests import test_train_trainer  # noqa: F401  (puts the repo root on sys.path)


def test_sigmoid_cross_entropy_by_hand():
  logits = np.array([[0.0, 2.0], [-1.0, 3.0]], np.float32)
  labels = np.array([[1.0, 0.0], [1.0, 1.0]], np.float32)
  softplus = lambda x: math.log1p(math.exp(x))
  # row 0: -log s(0) - log(1 - s(2)); row 1: -log s(-1) - log s(3)
  want = ((math.log(2) + softplus(2.0)) + (softplus(1.0) + softplus(-3.0))) / 2
  assert float(losses.sigmoid_cross_entropy(logits, labels)) == pytest.approx(want, rel=1e-6)
  other = optax.sigmoid_binary_cross_entropy(logits, labels).sum(axis=1).mean()
  assert float(losses.sigmoid_cross_entropy(logits, labels)) == pytest.approx(float(other))
  # Stable far from zero: log(1 - s(100)) would be -inf computed naively.
  assert float(losses.sigmoid_cross_entropy(np.array([[100.0]]), np.array([[0.0]]))) == \
      pytest.approx(100.0)


def test_softmax_cross_entropy_by_hand():
  logits = np.array([[1.0, 2.0, 3.0]], np.float32)
  want = -math.log(math.exp(3) / (math.exp(1) + math.exp(2) + math.exp(3)))
  got = losses.softmax_cross_entropy(logits, np.array([[0.0, 0.0, 1.0]]))
  assert float(got) == pytest.approx(want, rel=1e-6)
  with pytest.raises(ValueError, match=r"\[B, C\].*\(1, 3\).*\(1, 2\)"):
    losses.softmax_cross_entropy(logits, np.zeros((1, 2)))


def test_group_softmax_cross_entropy_by_hand():
  # Classes 0-1 form group a, 2-4 group b; class 5 is in no group.
  logits = np.array([[1.0, 0.0, 0.0, 1.0, 2.0, 9.0],
                     [0.0, 0.0, 3.0, 3.0, 0.0, -9.0]], np.float32)
  labels = np.array([[1.0, 0.0, 0.0, 0.0, 1.0, 1.0],
                     [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]], np.float32)
  groups = [[0, 1], [2, 3, 4]]
  log_p = lambda z, i: z[i] - math.log(sum(math.exp(v) for v in z))  # noqa: E731
  a0 = -log_p([1.0, 0.0], 0)
  b0 = -log_p([0.0, 1.0, 2.0], 2)
  a1 = -0.5 * (log_p([0.0, 0.0], 0) + log_p([0.0, 0.0], 1))  # both positive: halves
  b1 = -0.5 * (log_p([3.0, 3.0, 0.0], 0) + log_p([3.0, 3.0, 0.0], 1))
  got = losses.group_softmax_cross_entropy(logits, labels, groups=groups)
  assert float(got) == pytest.approx((a0 + b0 + a1 + b1) / 2, rel=1e-6)
  # Weights scale each group; weight 0 drops it.
  got = losses.group_softmax_cross_entropy(logits, labels, groups=groups, weights=[3.0, 0.0])
  assert float(got) == pytest.approx(3.0 * (a0 + a1) / 2, rel=1e-6)
  # A group without a positive adds nothing: row 1 has none in group a here.
  empty = labels.copy()
  empty[1, :2] = 0.0
  got = losses.group_softmax_cross_entropy(logits, empty, groups=groups)
  assert float(got) == pytest.approx((a0 + b0 + b1) / 2, rel=1e-6)
  # Focal: each term -t log p times (1 - p)^gamma.
  p = lambda z, i: math.exp(log_p(z, i))  # noqa: E731
  want = ((1 - p([1.0, 0.0], 0)) ** 2 * a0 + (1 - p([0.0, 1.0, 2.0], 2)) ** 2 * b0
          - 0.5 * (0.5 ** 2) * 2 * log_p([0.0, 0.0], 0)
          - 0.5 * (1 - p([3.0, 3.0, 0.0], 0)) ** 2 * 2 * log_p([3.0, 3.0, 0.0], 0)) / 2
  got = losses.group_softmax_cross_entropy(logits, labels, groups=groups, focal_gamma=2.0)
  assert float(got) == pytest.approx(want, rel=1e-6)


def test_group_softmax_task_reads_the_world_groups():
  config = synthetic_video_pretrain.get_config("tiny")
  config.loss.name = "group_softmax_xent"
  config.loss.group_weights = {"shape": 4.0, "sound": 0.0}
  task = classification.VideoClassificationTask(config)
  groups = task._loss.keywords["groups"]  # pylint: disable=protected-access
  names = [[synthetic.LABEL_NAMES[i].split(":")[0] for i in g] for g in groups]
  assert [n[0] for n in names] == list(synthetic.LABEL_GROUPS)
  assert all(len(set(n)) == 1 for n in names)
  weights = dict(zip(synthetic.LABEL_GROUPS, task._loss.keywords["weights"]))  # pylint: disable=protected-access
  assert weights == {"shape": 4.0, "colour": 1.0, "motion": 1.0, "background": 1.0,
                     "sound": 0.0, "count": 1.0}
  config.loss.group_weights = {"shapes": 2.0}
  with pytest.raises(ValueError, match=r"group_weights names \['shapes'\]"):
    classification.VideoClassificationTask(config)


def test_attribute_labels_of_a_two_object_scene():
  attributes = {"objects": [{"shape": "circle", "colour": "red", "motion": "still"},
                            {"shape": "circle", "colour": "blue", "motion": "left"}],
                "background": "striped", "sound": "silence", "num_objects": 2}
  y = synthetic.attribute_labels(attributes)
  on = {synthetic.LABEL_NAMES[i] for i in np.flatnonzero(y)}
  assert on == {"shape:circle", "colour:red", "colour:blue", "motion:still", "motion:left",
                "background:striped", "sound:silence", "count:2"}
  assert len(synthetic.LABEL_NAMES) == 4 + 6 + 5 + 4 + 5 + 2


def test_clip_labels_from_stored_label_fields():
  labels = classification.ClipLabels(3)
  np.testing.assert_array_equal(labels({"label": np.int64(2)}), [0, 0, 1])
  np.testing.assert_array_equal(labels({"label": [1, 0, 1]}), [1, 0, 1])
  with pytest.raises(ValueError, match=r"label 3 outside \[0, 3\)"):
    labels({"label": 3})
  with pytest.raises(ValueError, match=r"shape \(2,\), expected \(3,\)"):
    labels({"label": [1, 0]})
  with pytest.raises(ValueError, match="no labels"):
    labels({"caption": "x"})


def test_labels_come_from_the_datasets_declared_truth():
  config = synthetic_video_pretrain.get_config()
  assert classification.label_names(config) == synthetic.LABEL_NAMES
  truth = ground_truth.of_dataset(config.dataset)
  attributes = synthetic.ClipCaptionSource("val", num_examples=1).describe(0)["attributes"]
  np.testing.assert_array_equal(classification.ClipLabels(26, truth)({"attributes": attributes}),
                                synthetic.attribute_labels(attributes))
  # Without a declared truth, attributes mean nothing: the stored label is read.
  config.dataset.name, config.model.num_classes = "msrvtt", 3
  assert classification.label_names(config) == ("class_0", "class_1", "class_2")
  np.testing.assert_array_equal(
      classification.ClipLabels(3)({"attributes": attributes, "label": 1}), [0, 1, 0])


def test_classification_metrics_by_hand():
  names = ("g:a", "g:b", "h:x")
  labels = np.array([[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 1, 1]])
  logits = np.array([[3.0, 1.0, 0.5], [0.0, 2.0, 0.1], [1.0, 0.0, 0.2], [2.0, 1.0, 0.3]])
  m = classification_metrics.classification_metrics(logits, labels, names)
  # g:a scores 3, 0, 1, 2 -> ranking v0(+), v3(-), v2(+), v1(-): AP = (1 + 2/3) / 2
  # g:b scores 1, 2, 0, 1 -> v1(+), then the tie v0(-)/v3(+) with the irrelevant first,
  #   then v2(+): AP = (1 + 2/3 + 3/4) / 3
  # h:x scores .5, .1, .2, .3 -> v0(+), v3(+): AP = 1
  ap = [(1 + 2 / 3) / 2, (1 + 2 / 3 + 3 / 4) / 3, 1.0]
  assert m["mAP"] == pytest.approx(100 * np.mean(ap))
  assert m["g_mAP"] == pytest.approx(100 * np.mean(ap[:2]))
  assert m["h_mAP"] == pytest.approx(100.0)
  # group g, videos with exactly one positive: v0 (argmax a, right), v1 (b, right),
  # v3 (argmax a, wrong); v2 has two positives and is not counted.
  assert m["g_accuracy"] == pytest.approx(100 * 2 / 3)
  assert m["h_accuracy"] == pytest.approx(100.0)
  assert "top1_accuracy" not in m  # multi-label
  single = classification_metrics.classification_metrics(logits[:2, :2], np.eye(2), ("a", "b"))
  assert single["top1_accuracy"] == 100.0 and single["classes_without_positives"] == 0


def test_pretrain_task_trains_and_evaluates(tmp_path):
  config = synthetic_video_pretrain.get_config("tiny")
  state = experiment.build(config, tmp_path).train()
  assert int(state.step) == config.train.num_steps
  latest = json.loads((tmp_path / "results.json").read_text())["latest"]
  for key in ("mAP", "shape_accuracy", "motion_mAP", "sound_accuracy", "count_accuracy"):
    assert 0.0 <= latest[f"test/{key}"] <= 100.0
  assert latest["test/num_videos"] == config.dataset.num_eval


def test_unknown_loss_is_an_error():
  config = synthetic_video_pretrain.get_config("tiny")
  config.loss.name = "hinge"
  with pytest.raises(ValueError, match="config.loss.name='hinge'"):
    classification.VideoClassificationTask(config)


def test_stage_one_and_avr_demo_share_the_rgb_tower():
  """Stage 1 hands `video/rgb/` to the AVR demo (init_from): both variants of the tower
  configure the same MBT fields; the paper config stays the pure ViT-B."""
  from configs import videocc_avr  # pylint: disable=g-import-not-at-top
  from avtext.models import mbt  # pylint: disable=g-import-not-at-top
  fields = ("hidden_size", "num_layers", "num_heads", "mlp_dim", "rgb_patch", "rgb_stem",
            "rgb_pool", "layer_scale", "patch_embed")
  for pretrain, avr in (("", "demo"), ("hybrid", "demo,hybrid")):
    tower = synthetic_video_pretrain.get_config(pretrain).model.video
    want = videocc_avr.get_config(avr).model.video
    assert {f: tower.get(f) for f in fields} == {f: want.get(f) for f in fields}
  demo = synthetic_video_pretrain.get_config().model.video
  assert "rgb_stem" not in demo  # MBT's default (): ViT's linear patch embedding
  assert (demo.rgb_pool, demo.layer_scale) == ("max", 0.1)
  hybrid = synthetic_video_pretrain.get_config("hybrid").model.video
  assert (hybrid.rgb_stem, hybrid.rgb_pool, hybrid.layer_scale) == ((32, 64), "max", 0.1)
  # The paper config leaves the demo's options to MBT's defaults: ViT's linear patch
  # embedding, its [CLS] output, no LayerScale.
  paper = videocc_avr.get_config().model.video
  assert not {"rgb_stem", "rgb_pool", "layer_scale"} & set(paper)
  defaults = mbt.DemoOptions()
  assert (tuple(defaults.rgb_stem), defaults.rgb_pool, defaults.layer_scale) == ((), "cls", 0.0)
  with pytest.raises(ValueError, match="'hybrid' is a variant of the demo's RGB tower"):
    synthetic_video_pretrain.get_config("tiny,hybrid")
