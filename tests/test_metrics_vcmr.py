"""Tests for avtext.metrics.vcmr (TVR Sec. 5 "Metrics").

The reference numbers in tests/data/tvr_eval/expected_metrics.json come from
the official TVRetrieval standalone_eval/eval.py run on our own synthetic
inputs; tests/data/tvr_eval/README.md gives the exact command and commit.
The other expectations are worked out by hand in the comments.
"""
import json
import math
import pathlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from avtext.metrics import vcmr

_FIXTURE = pathlib.Path(__file__).parent / "data" / "tvr_eval"


# ----------------------------------------------------------------- temporal_iou

def test_temporal_iou_hand_computed():
  pred = [[0, 10], [2, 4], [0, 1], [0, 1], [3, 7], [5, 5]]
  gt = [[5, 15], [0, 10], [2, 3], [1, 2], [3, 7], [5, 5]]
  # 5/15 overlap; 2/10 inside; disjoint; touching; identical; both empty.
  np.testing.assert_allclose(vcmr.temporal_iou(pred, gt),
                             [1 / 3, 0.2, 0.0, 0.0, 1.0, 0.0], rtol=1e-12)


def test_temporal_iou_pairwise_by_broadcasting():
  pred = np.array([[0.0, 4.0], [2.0, 6.0]])
  gt = np.array([[0.0, 2.0], [1.0, 5.0], [10.0, 12.0]])
  iou = vcmr.temporal_iou(pred[:, None], gt[None])  # [2, 3]
  expected = [[2 / 4, 3 / 5, 0.0],
              [0 / 6, 3 / 5, 0.0]]
  np.testing.assert_allclose(iou, expected, rtol=1e-12)


def test_temporal_iou_keeps_float32_and_rejects_bad_shape():
  iou = vcmr.temporal_iou(np.float32([[0, 7]]), np.float32([0, 10]))
  assert iou.dtype == np.float32 and iou[0] == np.float32(0.7)
  with pytest.raises(ValueError, match="trailing dimension of 2"):
    vcmr.temporal_iou([0, 1, 2], [0, 1])


_span = st.tuples(st.floats(0, 100, allow_nan=False), st.floats(0, 50, allow_nan=False)).map(
    lambda s: (s[0], s[0] + s[1]))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(_span, _span), min_size=1, max_size=8))
def test_temporal_iou_matches_loop_reference(pairs):
  pred = np.array([p for p, _ in pairs])
  gt = np.array([g for _, g in pairs])
  got = vcmr.temporal_iou(pred, gt)
  for (p, g), value in zip(pairs, got):
    inter = max(0.0, min(p[1], g[1]) - max(p[0], g[0]))
    union = (p[1] - p[0]) + (g[1] - g[0]) - inter  # The textbook union.
    expected = inter / union if union > 0 and inter > 0 else 0.0
    assert value == pytest.approx(expected, abs=1e-9)
  np.testing.assert_array_equal(got, vcmr.temporal_iou(gt, pred))  # Symmetric.


# ------------------------------------------------- official-script equivalence

def test_matches_official_script_on_fixture_paths():
  expected = json.loads((_FIXTURE / "expected_metrics.json").read_text())
  got = vcmr.evaluate_predictions(_FIXTURE / "submission.json",
                                     str(_FIXTURE / "ground_truth.jsonl"))
  assert got == expected
  assert list(got) == list(expected)  # Same layout, so users can diff.
  for task in expected:
    assert list(got[task]) == list(expected[task])


def test_matches_official_script_on_loaded_objects():
  expected = json.loads((_FIXTURE / "expected_metrics.json").read_text())
  submission = json.loads((_FIXTURE / "submission.json").read_text())
  gt = [json.loads(line) for line in (_FIXTURE / "ground_truth.jsonl").read_text().splitlines()]
  assert vcmr.evaluate_predictions(submission, gt) == expected
  only_vr = {"video2idx": submission["video2idx"], "VR": submission["VR"]}
  assert vcmr.evaluate_predictions(only_vr, gt) == {
      "VR": expected["VR"], "VR_by_type": expected["VR_by_type"]}


# ------------------------------------------------------------ hand-worked cases

def _gt():
  return [
      {"desc_id": 1, "vid_name": "a", "ts": [0, 10], "type": "v"},
      {"desc_id": 2, "vid_name": "b", "ts": [10, 20], "type": "t"},
      {"desc_id": 3, "vid_name": "c", "ts": [0, 4], "type": "vt"},
      {"desc_id": 4, "vid_name": "a", "ts": [20, 30], "type": "v"},
  ]


def _entries(preds_by_id):
  return [{"desc_id": i, "desc": "", "predictions": [p + [0.0] for p in preds]}
          for i, preds in preds_by_id.items()]


def _hand_submission():
  return {
      "video2idx": {"a": 0, "b": 1, "c": 2},
      "VCMR": _entries({
          # Right span on the wrong video, IoU 0.6 (rank 1), IoU 0.8 (rank 2).
          1: [[1, 0, 10], [0, 0, 6], [0, 0, 8]],
          2: [[1, 10, 20]],  # Exact at rank 0.
          3: [[0, 0, 4]] * 5 + [[2, 0, 4]],  # Five duplicates, hit at rank 5.
          4: [[0, 0, 10], [0, 25, 40]],  # IoU 0 and 5/20.
      }),
      "SVMR": _entries({
          1: [[1, 0, 10], [1, 0, 10], [0, 0, 9]],  # Other videos skipped: IoU 0.9 at rank 0.
          2: [[1, 0, 2], [1, 12, 20]],  # IoU 0.8 at rank 1.
          3: [[2, 0, 2.4]],  # IoU 0.6: a hit at 0.5 only.
          4: [[0, 20, 30]],
      }),
      "VR": _entries({
          1: [[1, 0, 0], [1, 0, 0], [0, 0, 0]],  # Repeated video takes ranks: rank 2.
          2: [[1, 0, 0]],
          3: [[0, 0, 0]] * 10 + [[2, 0, 0]],  # Rank 10: outside R@10.
          4: [[1, 0, 0]],
      }),
  }


def test_hand_worked_recalls():
  got = vcmr.evaluate_predictions(_hand_submission(), _gt())
  # VCMR first-hit ranks: q1 1 (0.5) / 2 (0.7), q2 0, q3 5, q4 none.
  assert got["VCMR"] == {
      "0.5-r1": 25.0, "0.5-r5": 50.0, "0.5-r10": 75.0, "0.5-r100": 75.0,
      "0.7-r1": 25.0, "0.7-r5": 50.0, "0.7-r10": 75.0, "0.7-r100": 75.0}
  # SVMR ranks after dropping other videos: q1 0, q2 1, q3 0 (0.5 only), q4 0.
  assert got["SVMR"] == {
      "0.5-r1": 75.0, "0.5-r5": 100.0, "0.5-r10": 100.0, "0.5-r100": 100.0,
      "0.7-r1": 50.0, "0.7-r5": 75.0, "0.7-r10": 75.0, "0.7-r100": 75.0}
  # VR ranks: q1 2, q2 0, q3 10, q4 none.
  assert got["VR"] == {"r1": 25.0, "r5": 50.0, "r10": 50.0, "r100": 75.0}
  # Types: v = {q1, q4}, t = {q2}, vt = {q3}.
  by_type = got["VCMR_by_type"]
  assert (by_type["v-0.5-r1"], by_type["v-0.5-r5"], by_type["v-0.7-r100"]) == (0.0, 50.0, 50.0)
  assert by_type["t-0.7-r1"] == 100.0
  assert (by_type["vt-0.5-r5"], by_type["vt-0.5-r10"]) == (0.0, 100.0)
  assert got["SVMR_by_type"]["vt-0.7-r100"] == 0.0
  assert got["VR_by_type"]["vt-r100"] == 100.0
  assert by_type["desc_type_ratio"] == "v 50.0 t 25.0 vt 25.0"


def test_rounding_to_two_decimals():
  gt = [{"desc_id": i, "vid_name": "a", "ts": [0, 1], "type": "v"} for i in range(3)]
  sub = {"video2idx": {"a": 0, "b": 1},
         "VR": _entries({0: [[0, 0, 0]], 1: [[0, 0, 0]], 2: [[1, 0, 0]]})}
  got = vcmr.evaluate_predictions(sub, gt)
  assert got["VR"]["r1"] == 66.67  # 2/3.
  assert math.isnan(got["VR_by_type"]["t-r1"])  # No subtitle queries: NaN, as officially.
  assert got["VR_by_type"]["desc_type_ratio"] == "v 100.0 t 0.0 vt 0.0"


def test_threshold_is_decided_in_float32():
  # In float64 (33.57 - 24.4) / (42.74 - 24.4) == 0.5 exactly; in float32 (the
  # official script's precision) the IoU is 0.49999994, so it is not a hit.
  assert (33.57 - 24.4) / (42.74 - 24.4) == 0.5
  gt = [{"desc_id": 0, "vid_name": "a", "ts": [24.4, 42.74], "type": "v"}]
  sub = {"video2idx": {"a": 0}, "VCMR": _entries({0: [[0, 24.4, 33.57]]})}
  assert vcmr.evaluate_predictions(sub, gt)["VCMR"]["0.5-r1"] == 0.0
  # float32(0.7) IoU meets the float32(0.7) threshold.
  gt[0]["ts"] = [0, 10]
  sub["VCMR"] = _entries({0: [[0, 0, 7]]})
  assert vcmr.evaluate_predictions(sub, gt)["VCMR"]["0.7-r1"] == 100.0


def test_only_top_100_predictions_count():
  gt = [{"desc_id": 0, "vid_name": "a", "ts": [0, 10], "type": "v"},
        {"desc_id": 1, "vid_name": "a", "ts": [0, 10], "type": "t"}]
  miss, hit = [1, 0, 10], [0, 0, 10]
  sub = {"video2idx": {"a": 0, "b": 1},
         "VCMR": _entries({0: [miss] * 99 + [hit], 1: [miss] * 100 + [hit]}),
         # SVMR cuts to 100 before dropping other videos: query 1 has no hit left.
         "SVMR": _entries({0: [miss] * 99 + [hit], 1: [miss] * 100 + [hit]})}
  got = vcmr.evaluate_predictions(sub, gt)
  assert got["VCMR"]["0.5-r100"] == 50.0 and got["VCMR"]["0.5-r10"] == 0.0
  assert got["SVMR"]["0.5-r1"] == 50.0 and got["SVMR"]["0.5-r100"] == 50.0
  got = vcmr.evaluate_predictions(sub, gt, max_pred_per_query=101, by_type=False)
  assert got["SVMR"]["0.5-r1"] == 100.0 and "SVMR_by_type" not in got


def test_didemo_style_ground_truth_needs_two_agreeing_spans():
  gt = [{"desc_id": 0, "vid_name": "a", "ts": [[0, 5], [0, 5], [5, 10], [10, 15]]},
        {"desc_id": 1, "vid_name": "a", "ts": [[0, 5], [5, 10], [10, 15], [15, 20]]}]
  sub = {"video2idx": {"a": 0}, "VCMR": _entries({0: [[0, 0, 5]], 1: [[0, 0, 5]]})}
  got = vcmr.evaluate_predictions(sub, gt, by_type=False)
  assert got == {"VCMR": {f"{t}-r{k}": 50.0 for t in (0.5, 0.7) for k in (1, 5, 10, 100)}}


def test_query_without_predictions_is_a_miss():
  gt = [{"desc_id": 0, "vid_name": "a", "ts": [0, 10], "type": "v"},
        {"desc_id": 1, "vid_name": "a", "ts": [0, 10], "type": "v"}]
  sub = {"video2idx": {"a": 0}, "VCMR": _entries({0: [], 1: [[0, 0, 10]]}),
         "SVMR": _entries({0: [], 1: [[0, 0, 10]]}), "VR": _entries({0: [], 1: [[0, 0, 0]]})}
  got = vcmr.evaluate_predictions(sub, gt)
  assert got["VCMR"]["0.7-r1"] == got["SVMR"]["0.5-r100"] == got["VR"]["r5"] == 50.0


@pytest.mark.parametrize("mutate, message", [
    (lambda sub, gt: sub["VCMR"].pop(), "must cover exactly"),
    (lambda sub, gt: sub["VR"].append(dict(sub["VR"][0])), "more than once"),
    (lambda sub, gt: gt.append(dict(gt[0])), "more than once"),
    (lambda sub, gt: gt[0].update(vid_name="zzz"), "not in submission\\['video2idx'\\]"),
    (lambda sub, gt: gt[0].pop("type"), "by_type=False"),
    (lambda sub, gt: gt[0].update(ts=[[0, 1], [2, 3]]), "'ts' must be"),
    (lambda sub, gt: sub.pop("video2idx"), "video2idx"),
    (lambda sub, gt: [sub.pop(t) for t in ("VCMR", "SVMR", "VR")], "none of the task"),
    (lambda sub, gt: sub["SVMR"][0].update(predictions=[[0, 1]]), "video_idx, st, ed"),
])
def test_bad_inputs_raise(mutate, message):
  sub, gt = _hand_submission(), _gt()
  mutate(sub, gt)
  with pytest.raises(ValueError, match=message):
    vcmr.evaluate_predictions(sub, gt)


def test_bad_iou_threshold_raises():
  with pytest.raises(ValueError, match="iou_thds"):
    vcmr.evaluate_predictions(_hand_submission(), _gt(), iou_thds=(0.0,))
