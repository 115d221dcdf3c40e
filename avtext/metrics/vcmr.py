"""Moment retrieval metrics: temporal IoU and the TVR R@K protocol.

TVR (Lei et al. 2020) Sec. 5, "Metrics": average recall at K (R@K) over all
queries; a predicted moment is correct when (i) its video is the ground-truth
video and (ii) its temporal IoU with the ground-truth span reaches the
threshold. Table 3 reports VCMR at IoU 0.5 / 0.7 and K in {1, 5, 10, 100};
app. B adds SVMR and VR and the breakdown by query type (Sec. 3: a query
describes the video ``v``, the subtitle ``t`` or both ``vt``).

`evaluate_predictions` reproduces the numbers of the official
`standalone_eval/eval.py` of jayleicn/TVRetrieval (checked against it in
tests/test_metrics_vcmr.py). The behaviour it shares with that script:

- Only the first `max_pred_per_query` (100) predictions of a query count, in
  the order given; the score entry is ignored, so ties never reorder anything.
- VCMR: R@K is the fraction of queries with at least one correct moment among
  their first K predictions. Repeated videos and duplicate moments each take
  a rank.
- SVMR: predictions on other videos are dropped (after the top-100 cut), then
  the first K of the remaining ones are checked.
- VR: R@K is the fraction of queries whose ground-truth video appears among
  the first K predicted video ids (repeats take ranks; spans are unused).
- Spans are compared in float32, as the official script does, so IoUs that
  land on a threshold decide the same way (0.7 is compared as float32(0.7)).
  Video ids are compared exactly (the official script also casts them to
  float32, which only differs for ids beyond 2**24).
- Ground truth with four or more spans (DiDeMo style) counts a prediction as
  correct when it reaches the threshold against at least two of them.
- Percentages are rounded to two decimals with numpy's rounding; a query type
  with no queries gives NaN, as in the official script.

Where the official script fails (a query with no predictions, duplicated
desc_ids), this module counts the query as a miss or raises a ValueError.
"""
import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

TASK_TYPES = ("VCMR", "SVMR", "VR")
QUERY_TYPES = ("v", "t", "vt")  # video-only, subtitle-only, video+subtitle.
_DIDEMO_MIN_SPANS = 4  # GT with this many spans is a DiDeMo annotator set.
_DIDEMO_MIN_AGREEING = 2  # ...and a hit must match this many of them.


def temporal_iou(pred_spans: Any, gt_spans: Any) -> np.ndarray:
  """Temporal IoU of [st, ed] spans in seconds (TVR Sec. 5, "Metrics").

  The leading dimensions broadcast against each other (numpy rules), so
  `temporal_iou(p, g)` with p, g: [N, 2] is elementwise -> [N], and the
  pairwise matrix is `temporal_iou(p[:, None], g[None])` -> [N, M].

  The union is taken as the hull max(ed) - min(st): it equals the union
  whenever the spans overlap and the IoU is 0 otherwise, and it is the
  formula of the official TVR script, so float32 inputs round identically.
  A zero-length hull gives IoU 0.

  Args:
    pred_spans: [..., 2] array-like of (st, ed) with st <= ed.
    gt_spans: [..., 2] array-like of (st, ed), broadcastable with pred_spans.

  Returns:
    IoU in [0, 1], the broadcast shape of the leading dims; float32 inputs
    stay float32, anything else is computed in float64.
  """
  pred = np.asarray(pred_spans)
  gt = np.asarray(gt_spans)
  dtype = np.result_type(pred, gt, np.float32)
  if not np.issubdtype(dtype, np.floating) or dtype == np.float16:
    dtype = np.float64
  pred, gt = pred.astype(dtype), gt.astype(dtype)
  if pred.shape[-1:] != (2,) or gt.shape[-1:] != (2,):
    raise ValueError(
        f"spans must have a trailing dimension of 2 (st, ed); got shapes "
        f"{pred.shape} and {gt.shape}")
  inter = np.maximum(
      0, np.minimum(pred[..., 1], gt[..., 1]) - np.maximum(pred[..., 0], gt[..., 0]))
  hull = np.maximum(pred[..., 1], gt[..., 1]) - np.minimum(pred[..., 0], gt[..., 0])
  safe_hull = np.where(hull > 0, hull, 1)
  return np.where(hull > 0, inter / safe_hull, 0).astype(dtype)


def _load_submission(submission: Mapping[str, Any] | str | os.PathLike) -> Mapping[str, Any]:
  if isinstance(submission, (str, os.PathLike)):
    with open(submission) as f:
      return json.load(f)
  return submission


def _load_ground_truth(ground_truth: Sequence[Mapping[str, Any]] | str | os.PathLike
                       ) -> Sequence[Mapping[str, Any]]:
  if isinstance(ground_truth, (str, os.PathLike)):
    with open(ground_truth) as f:
      return [json.loads(line) for line in f if line.strip()]
  return ground_truth


def _index_by_desc_id(items: Sequence[Mapping[str, Any]], what: str) -> dict[Any, Mapping]:
  by_id = {}
  for item in items:
    if item["desc_id"] in by_id:
      raise ValueError(f"{what}: desc_id {item['desc_id']!r} appears more than once")
    by_id[item["desc_id"]] = item
  return by_id


def _gt_spans(gt_item: Mapping[str, Any]) -> np.ndarray:
  """GT spans as float32 [S, 2]; S == 1 for TVR, S >= 4 for DiDeMo."""
  ts = gt_item["ts"]
  if len(ts) == 2 and all(isinstance(t, (int, float)) for t in ts):
    return np.asarray([ts], dtype=np.float32)
  if len(ts) >= _DIDEMO_MIN_SPANS and all(len(t) == 2 for t in ts):
    return np.asarray(ts, dtype=np.float32)
  raise ValueError(
      f"desc_id {gt_item['desc_id']!r}: 'ts' must be [st, ed] (TVR) or a list of "
      f">= {_DIDEMO_MIN_SPANS} [st, ed] spans (DiDeMo); got {ts!r}")


def _first_hit_rank(hits: np.ndarray) -> float:
  """0-based rank of the first True in a 1-D bool array; inf when none."""
  found = np.flatnonzero(hits)
  return float(found[0]) if found.size else math.inf


def _query_ranks(task: str, predictions: Sequence[Sequence[float]],
                 gt_item: Mapping[str, Any], gt_video_idx: int,
                 iou_thds: Sequence[float], max_pred_per_query: int) -> dict[Any, float]:
  """First-hit rank of one query, keyed by IoU threshold (VR: key None)."""
  top = predictions[:max_pred_per_query]
  if any(len(p) < 3 for p in top):
    raise ValueError(f"{task} desc_id {gt_item['desc_id']!r}: each prediction must be "
                     f"[video_idx, st, ed, (score)]")
  video_hit = np.asarray([p[0] == gt_video_idx for p in top], dtype=bool)  # [n_pred]
  if task == "VR":
    return {None: _first_hit_rank(video_hit)}
  spans = np.asarray([p[1:3] for p in top], dtype=np.float32).reshape(-1, 2)  # [n_pred, 2]
  gt = _gt_spans(gt_item)  # [S, 2]
  ious = temporal_iou(spans[:, None], gt[None])  # [n_pred, S]
  min_agreeing = 1 if len(gt) == 1 else _DIDEMO_MIN_AGREEING
  ranks = {}
  for thd in iou_thds:
    hits = video_hit & ((ious >= np.float32(thd)).sum(axis=1) >= min_agreeing)
    if task == "SVMR":
      hits = hits[video_hit]  # Ranks count only predictions on the GT video.
    ranks[thd] = _first_hit_rank(hits)
  return ranks


def _percent(count: int, total: int) -> float:
  """Percentage rounded like the official script (numpy rounding of a float64)."""
  if total == 0:
    return math.nan
  return float(np.round(np.float64(count) / total * 100, 2))


def _recall_table(ranks: dict[Any, np.ndarray], recall_topks: Sequence[int],
                  prefix: str = "") -> dict[str, float]:
  table = {}
  for thd, r in ranks.items():
    thd_part = "" if thd is None else f"{thd}-"
    for k in recall_topks:
      table[f"{prefix}{thd_part}r{k}"] = _percent(int(np.sum(r < k)), len(r))
  return table


def evaluate_predictions(
    submission: Mapping[str, Any] | str | os.PathLike,
    ground_truth: Sequence[Mapping[str, Any]] | str | os.PathLike,
    *,
    iou_thds: Sequence[float] = (0.5, 0.7),
    recall_topks: Sequence[int] = (1, 5, 10, 100),
    max_pred_per_query: int = 100,
    by_type: bool = True,
) -> dict[str, dict[str, Any]]:
  """TVR R@K for VCMR, SVMR and VR (TVR Sec. 5 "Metrics", Table 3, app. B).

  Args:
    submission: the TVR submission dict, or a path to its JSON:
      {"video2idx": {vid_name: idx}, "VCMR" | "SVMR" | "VR": [{"desc_id",
      "desc", "predictions": [[video_idx, st, ed, score], ...]}, ...]}.
      Every task present is evaluated; at least one must be.
    ground_truth: the annotation list (dicts with desc_id, vid_name, ts and,
      for `by_type`, type in {"v", "t", "vt"}), or a path to its jsonl.
    iou_thds: IoU thresholds in (0, 1]; a hit needs IoU >= threshold.
    recall_topks: the K of R@K.
    max_pred_per_query: only this many leading predictions of a query count.
    by_type: also report "<task>_by_type" with R@K per query type and the
      "desc_type_ratio" string, as the official script does.

  Returns:
    The official script's structure: {"VCMR": {"0.5-r1": pct, ...},
    "SVMR": {...}, "VR": {"r1": pct, ...}, "VCMR_by_type": {"v-0.5-r1": pct,
    ..., "desc_type_ratio": "v 33.33 t 33.33 vt 33.33"}, ...}, percentages
    rounded to two decimals.
  """
  submission = _load_submission(submission)
  ground_truth = _load_ground_truth(ground_truth)
  if any(not 0 < thd <= 1 for thd in iou_thds):
    raise ValueError(f"iou_thds must lie in (0, 1]; got {tuple(iou_thds)}")
  if "video2idx" not in submission:
    raise ValueError("submission has no 'video2idx' mapping (vid_name -> video index)")
  tasks = [t for t in TASK_TYPES if t in submission]
  if not tasks:
    raise ValueError(f"submission has none of the task entries {TASK_TYPES}; "
                     f"keys found: {sorted(submission)}")
  video2idx = submission["video2idx"]
  gt_by_id = _index_by_desc_id(ground_truth, "ground truth")
  if not gt_by_id:
    raise ValueError("ground truth is empty")
  if by_type:
    bad = {item.get("type") for item in gt_by_id.values()} - set(QUERY_TYPES)
    if bad:
      raise ValueError(f"ground-truth query types {sorted(map(str, bad))} are not in "
                       f"{QUERY_TYPES}; pass by_type=False for data without TVR types")
    types = np.asarray([item["type"] for item in gt_by_id.values()])  # [n_query]

  results, results_by_type = {}, {}
  for task in tasks:
    preds_by_id = _index_by_desc_id(submission[task], f"submission[{task!r}]")
    missing, extra = gt_by_id.keys() - preds_by_id.keys(), preds_by_id.keys() - gt_by_id.keys()
    if missing or extra:
      raise ValueError(
          f"submission[{task!r}] must cover exactly the ground-truth desc_ids: "
          f"{len(missing)} missing (e.g. {sorted(missing, key=str)[:5]}), "
          f"{len(extra)} unknown (e.g. {sorted(extra, key=str)[:5]})")
    per_query = []
    for desc_id, gt_item in gt_by_id.items():
      if gt_item["vid_name"] not in video2idx:
        raise ValueError(f"desc_id {desc_id!r}: ground-truth video {gt_item['vid_name']!r} "
                         f"is not in submission['video2idx']")
      per_query.append(_query_ranks(
          task, preds_by_id[desc_id]["predictions"], gt_item,
          video2idx[gt_item["vid_name"]], iou_thds, max_pred_per_query))
    ranks = {key: np.asarray([q[key] for q in per_query]) for key in per_query[0]}
    results[task] = _recall_table(ranks, recall_topks)
    if by_type:
      table = {}
      for qtype in QUERY_TYPES:
        in_type = types == qtype
        table.update(_recall_table(
            {key: r[in_type] for key, r in ranks.items()}, recall_topks, prefix=f"{qtype}-"))
      table["desc_type_ratio"] = " ".join(
          f"{qtype} {_percent(int(np.sum(types == qtype)), len(types))}" for qtype in QUERY_TYPES)
      results_by_type[f"{task}_by_type"] = table
  return {**results, **results_by_type}
