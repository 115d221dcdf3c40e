"""Hierarchical retrieval evaluator (`type="hierarchical"`): COOT.

Two levels over the whole split, both directions, as the official validation
(`coot/trainer_retrieval.py` + `nntrainer/retrieval.py`): video <-> paragraph
(`v2p_`, `p2v_`) and clip <-> sentence (`c2s_`, `s2c_`) over every clip and
sentence of the split, on L2-normalised embeddings. Metrics: R@K (K in
`ks`, default 1, 5, 10, 50), MdR (COOT's median convention, see
`metrics.retrieval.median_rank`) and MnR; `vp_R@1_mean` and `cs_R@1_mean`
average the two directions' R@1 (ActivityNet's model selection uses the
video-paragraph one, YouCook2's the clip-sentence one); chance R@1 for each
level is 100 / #items.

Config fields (besides `base.Evaluator`'s):
  embed_fn           predict function returning video_emb, paragraph_emb [B, D],
                     clip_emb, sentence_emb [B, N, d] and clip_mask, sentence_mask
                     [B, N] (default "embed")
  ks                 R@K cut-offs (default (1, 5, 10, 50))
  median_convention  default "coot"
  export_embeddings  write `<workdir>/embeddings/embeddings_<step>.h5` (default True):
                     vid_emb, par_emb [V, D], clip_emb, sent_emb [C, d] (normalised, and
                     `<name>_before_norm`), key [V] (video ids), clip_num [V] — the official
                     file's datasets, so COOT's analysis scripts read it
"""
from typing import Any

from absl import logging
import jax
import numpy as np

from avtext import evals
from avtext.evals import base
from avtext.evals import protocols
from avtext.metrics import retrieval as metrics

LEVELS = (("v2p", "p2v", "vp", "videos"), ("c2s", "s2c", "cs", "clips"))


def _normalize(x: np.ndarray) -> np.ndarray:
  return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True))


def hierarchical_results(video: np.ndarray, paragraph: np.ndarray, clip: np.ndarray,
                         sentence: np.ndarray, *, ks=(1, 5, 10, 50),
                         median_convention: str = "coot") -> dict[str, float]:
  """Both levels' metrics from paired embeddings (row i of each pair matches)."""
  results: dict[str, float] = {}
  for (fwd, bwd, both, _), (vis, txt) in zip(LEVELS, ((video, paragraph), (clip, sentence))):
    sim = _normalize(vis) @ _normalize(txt).T  # [visual, text]
    for name, matrix in ((fwd, sim), (bwd, sim.T)):
      m = metrics.retrieval_metrics(matrix, ks=ks, median_convention=median_convention)
      results.update({f"{name}_{k}": float(v) for k, v in m.items()})
    results[f"{both}_R@1_mean"] = 0.5 * (results[f"{fwd}_R@1"] + results[f"{bwd}_R@1"])
    results[f"{both}_chance_r1"] = 100.0 / len(vis)
  results["num_videos"], results["num_clips"] = len(video), len(clip)
  return results


@evals.register_evaluator("hierarchical")
class HierarchicalEvaluator(base.Evaluator):
  """COOT's video-paragraph and clip-sentence retrieval."""

  protocol = protocols.Retrieval
  predict_fn_keys = {"embed_fn": "embed"}

  def evaluate(self, variables, *, mesh, step: int) -> dict[str, Any]:
    embed_fn = self.cache.predict_fn(self.predict_fn_name("embed_fn"))
    out, host = self.predict(("hierarchical", embed_fn), lambda: embed_fn, variables, mesh=mesh)
    clip_mask = out["clip_mask"].astype(bool)
    if not np.array_equal(clip_mask, out["sentence_mask"].astype(bool)):
      raise ValueError(f"{self.name}: clips and sentences do not pair up (masks differ)")
    clip, sentence = out["clip_emb"][clip_mask], out["sentence_emb"][clip_mask]
    results = hierarchical_results(
        out["video_emb"], out["paragraph_emb"], clip, sentence,
        ks=tuple(self.cfg.get("ks", (1, 5, 10, 50))),
        median_convention=self.cfg.get("median_convention", "coot"))
    if self.cfg.get("export_embeddings", True) and self.workdir is not None:
      if jax.process_index() == 0:
        self._export(step, out, clip, sentence, clip_mask.sum(1), host.get("id"))
    return results

  def _export(self, step, out, clip, sentence, clip_num, ids) -> None:
    import h5py  # pylint: disable=g-import-not-at-top
    directory = self.workdir / "embeddings"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"embeddings_{step}.h5"
    tmp = path.with_suffix(".h5.tmp")
    arrays = {"vid_emb": out["video_emb"], "par_emb": out["paragraph_emb"], "clip_emb": clip,
              "sent_emb": sentence}
    with h5py.File(tmp, "w") as h5:
      for name, value in arrays.items():
        h5[name] = _normalize(value)
        h5[f"{name}_before_norm"] = value
      h5["clip_num"] = np.asarray(clip_num, np.int64)
      h5["sent_num"] = np.asarray(clip_num, np.int64)
      if ids is not None:
        h5["key"] = np.asarray([str(k) for k in ids], dtype=h5py.string_dtype())
    tmp.replace(path)
    logging.info("%s: embeddings written to %s", self.name, path)

  def report(self, results: dict, step: int) -> None:
    ks = [k for k in (1, 5, 10, 50) if f"v2p_R@{k}" in results]
    lines = [f"== {self.name}: COOT retrieval, step {step}, {results['num_videos']} videos, "
             f"{results['num_clips']} clips =="]
    for fwd, bwd, both, items in LEVELS:
      for d in (fwd, bwd):
        recalls = "  ".join(f"R@{k} {results[f'{d}_R@{k}']:6.2f}" for k in ks)
        lines.append(f"{d}: {recalls}  MdR {results[f'{d}_MdR']:6.1f}  "
                     f"MnR {results[f'{d}_MnR']:7.1f}")
      lines.append(f"{both}: mean R@1 {results[f'{both}_R@1_mean']:.2f}   chance R@1 "
                   f"{results[f'{both}_chance_r1']:.2f} ({results[f'num_{items}']} {items})")
    print("\n".join(lines), flush=True)
