"""Text <-> video retrieval evaluator (`type="retrieval"`): AVR, S-MiT.

Config fields (besides `base.Evaluator`'s):
  text_fn            predict function embedding the queries, [B, D] (default "embed_text")
  video_fn           predict function embedding the videos, [B, K, D] with K test clips
                     per video, or [B, D] (default "embed_video")
  id_field           host field naming each example's video (default "video_id");
                     examples sharing it are captions of one video (one-to-many
                     ground truth); absent, example i's caption matches video i
  ks                 R@K cut-offs (default (1, 5, 10))
  median_convention  "plain" or "coot" (`metrics.retrieval.median_rank`)
  subset_protocol    None, or {n_subsets, subset_size, seed}: S-MiT's mean/std
                     over random 1k-pair subsets (paired data only)

Similarity (VideoCC §4.1): each caption is compared with each of a video's K
clips and the K scores are averaged. Metrics, both directions (`t2v_`, `v2t_`):
R@K, MdR, MnR and mAP, and `mean_R@K` / `mean_mAP`, the two directions' mean (S-MiT
table 2); with one-to-many ground truth a caption's correct item
is its video and a video's correct items are all its captions. Chance R@1 is
100 / #videos; a source that knows the best reachable R@1
(`avtext.data.ground_truth.RetrievalOracle`: a world that made its clips) adds it, and
R@1 beside the oracle's on each group of queries it names (`query_groups`).
"""
from typing import Any

import numpy as np

from avtext import evals
from avtext.data import ground_truth as source_truth
from avtext.evals import base
from avtext.evals import protocols
from avtext.metrics import retrieval as metrics


@evals.register_evaluator("retrieval")
class RetrievalEvaluator(base.Evaluator):
  """Dual-encoder retrieval metrics over the task's two embedding functions."""

  protocol = protocols.Retrieval

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    # The source's oracle numbers and query groups: the same at every evaluation.
    self._references = {}
  predict_fn_keys = {"text_fn": "embed_text", "video_fn": "embed_video"}

  def evaluate(self, variables, *, mesh, step: int) -> dict[str, Any]:
    del step
    text_fn = self.cache.predict_fn(self.predict_fn_name("text_fn"))
    video_fn = self.cache.predict_fn(self.predict_fn_name("video_fn"))

    def build():
      return lambda v, batch: {"text": text_fn(v, batch), "video": video_fn(v, batch)}

    out, host = self.predict(("retrieval", text_fn, video_fn), build, variables, mesh=mesh)
    text, video = out["text"], out["video"]  # [N, D], [N, K, D] or [N, D]
    if video.ndim == 2:
      video = video[:, None]
    t2v_gt, v2t_gt, video_rows = ground_truth(host.get(self.cfg.get("id_field", "video_id")),
                                              len(text))
    if video_rows is not None:
      video = video[video_rows]
    # VideoCC §4.1: compare each of the K clips with the caption, average the scores.
    sim = np.einsum("qd,nkd->qn", text, video) / video.shape[1]  # [N_text, N_video]
    return retrieval_results(sim, t2v_gt, v2t_gt, self.cfg, self.source,
                             references=self._references)

  def report(self, results: dict, step: int) -> None:
    lines = [f"== {self.name}: retrieval, step {step}, {results['num_videos']} videos, "
             f"{results['num_captions']} captions =="]
    for d in ("t2v", "v2t"):
      lines.append(f"{d}: R@1 {results[f'{d}_R@1']:6.2f}  R@5 {results[f'{d}_R@5']:6.2f}  "
                   f"R@10 {results[f'{d}_R@10']:6.2f}  MdR {results[f'{d}_MdR']:7.1f}  "
                   f"MnR {results[f'{d}_MnR']:7.1f}  mAP {results[f'{d}_mAP']:6.2f}")
    ref = f"chance R@1 {results['chance_r1']:.2f}"
    if "oracle_t2v_r1" in results:
      ref += (f"   oracle t2v R@1 {results['oracle_t2v_r1']:.2f}   "
              f"model/oracle {100 * results['t2v_R@1'] / results['oracle_t2v_r1']:.1f}%")
    lines.append(ref)
    for key, label in _group_labels(self._references).items():
      if f"{key}_t2v_r1" in results:
        lines.append(f"{label} ({results[f'{key}_num_captions']}): t2v R@1 "
                     f"{results[f'{key}_t2v_r1']:.2f}  "
                     f"oracle {results[f'{key}_oracle_t2v_r1']:.2f}")
    if "subset/mean/R@1" in results:  # S-MiT table 2 layout
      ks = [k.split("/")[-1] for k in sorted(results) if k.startswith("subset/mean/R@")
            and not k.endswith("_std")]
      cols = sorted(ks, key=lambda k: int(k[2:])) + ["mAP"]
      cfg = self.cfg.get("subset_protocol")
      lines.append(f"S-MiT protocol, {cfg['n_subsets']} random subsets of {cfg['subset_size']}"
                   f" pairs (chance R@1 {100 / cfg['subset_size']:.2f}), mean ± std:")
      lines.append(" " * 18 + "".join(f"{c:>13}" for c in cols))
      for d in ("caption_to_video", "video_to_caption", "mean"):
        lines.append(f"{d:<18}" + "".join(
            f"{results[f'subset/{d}/{c}']:7.1f}±{results[f'subset/{d}/{c}_std']:<4.1f} "
            for c in cols))
      if "subset/oracle_t2v_R@1" in results:
        lines.append(f"oracle caption_to_video R@1 on the same subsets: "
                     f"{results['subset/oracle_t2v_R@1']:.1f}")
    print("\n".join(lines), flush=True)


def ground_truth(ids: list | None, num_captions: int):
  """(t2v gt, v2t gt, row of each video's first caption) from per-example video ids.

  Without ids every example is its own video (the diagonal: gt None, rows None).
  """
  if ids is None:
    return None, None, None
  if len(ids) != num_captions:
    raise ValueError(f"{len(ids)} video ids for {num_captions} captions")
  column: dict[Any, int] = {}
  rows = []
  for row, vid in enumerate(ids):
    if vid not in column:
      column[vid] = len(rows)
      rows.append(row)
  t2v = np.array([column[v] for v in ids], np.int64)
  v2t = [[] for _ in rows]
  for caption, col in enumerate(t2v):
    v2t[col].append(caption)
  return t2v, v2t, np.array(rows)


def retrieval_results(sim: np.ndarray, t2v_gt, v2t_gt, cfg, source=None, *,
                      references: dict | None = None) -> dict[str, Any]:
  """Every metric of the module docstring for `sim  # [N_captions, N_videos]`.
  `references`: a dict kept by the caller across evaluations of one source, where the
  oracle's numbers (which do not depend on the model) are computed once."""
  ks = tuple(cfg.get("ks", (1, 5, 10)))
  convention = cfg.get("median_convention", "plain")
  results: dict[str, Any] = {}
  for name, matrix, gt in (("t2v", sim, t2v_gt), ("v2t", sim.T, v2t_gt)):
    m = metrics.retrieval_metrics(matrix, gt=gt, ks=ks, median_convention=convention)
    results.update({f"{name}_{k}": float(v) for k, v in m.items()})
    results[f"{name}_mAP"] = metrics.mean_average_precision(matrix, _relevance(gt, matrix.shape))
  for key in [f"R@{k}" for k in ks] + ["mAP"]:  # S-MiT's "Mean" columns (table 2)
    results[f"mean_{key}"] = (results[f"t2v_{key}"] + results[f"v2t_{key}"]) / 2
  results["num_captions"], results["num_videos"] = sim.shape
  results["chance_r1"] = 100.0 / sim.shape[1]
  subset = cfg.get("subset_protocol")
  subset = (subset.to_dict() if hasattr(subset, "to_dict") else dict(subset)) if subset else None
  if subset:
    if t2v_gt is not None:
      raise ValueError("subset_protocol needs paired data (one caption per video)")
    results.update({f"subset/{k}": v for k, v in metrics.subset_protocol(
        sim, ks=ks, **subset).items()})
  oracle = source_truth.retrieval_oracle(source)
  if t2v_gt is None and oracle is not None:
    key = (sim.shape[0], tuple(sorted((subset or {}).items())))
    cached = references if references is not None else {}
    if key not in cached:
      cached[key] = _oracle_references(oracle, sim.shape[0], subset)
    values, groups = cached[key]
    results.update(values)
    for name, (_, rows) in groups.items():
      results[f"{name}_t2v_r1"] = float(metrics.retrieval_metrics(sim[rows], gt=rows)["R@1"])
  return results


def _group_labels(references: dict) -> dict[str, str]:
  """{key: label} of the query groups in `retrieval_results`' references."""
  return {key: label for _, groups in references.values()
          for key, (label, _) in groups.items()}


def _relevance(gt, shape) -> np.ndarray | None:
  if gt is None:
    return None
  relevance = np.zeros(shape, bool)
  for q, items in enumerate(gt):
    relevance[q, items] = True
  return relevance


def _oracle_references(oracle: source_truth.RetrievalOracle, n: int, subset: dict | None
                       ) -> tuple[dict[str, float], dict[str, tuple[str, np.ndarray]]]:
  """({the oracle's R@1 on the n pairs, on each of the source's query groups and on the
  subset protocol's own subsets}, {key: (label, indices)} of the non-empty groups)."""
  out = {"oracle_t2v_r1": float(oracle.oracle_recall_at_1())}
  groups = {}
  for key, (label, rows) in oracle.query_groups(n).items():
    rows = np.asarray(rows, np.int64)
    if len(rows):
      out[f"{key}_oracle_t2v_r1"] = float(oracle.oracle_recall_at_1(rows))
      out[f"{key}_num_captions"] = int(len(rows))
      groups[key] = (label, rows)
  if subset:
    out["subset/oracle_t2v_R@1"] = float(np.mean([
        oracle.oracle_recall_at_1(idx, gallery_is_subset=True)
        for idx in metrics.subset_indices(n, **subset)]))
  return out, groups
