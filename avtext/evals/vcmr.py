"""Moment retrieval evaluator (`type="moments"`): XML's VR / SVMR / VCMR on a TVR split.

Config fields (besides `base.Evaluator`'s):
  corpus_dtype     storage of the encoded corpus: float32 (default), bfloat16, int8
  search           `avtext.inference.vcmr.SearchConfig` fields (top_n_videos 100,
                   alpha 20, min_len, max_len (the length prior, clips), max_before_nms 200)
  baselines        optional {random: {seed}}: random videos and random spans under the same
                   length prior, written and scored the same way
  keep_corpus      keep the encoded corpus directory after scoring (default True)

Steps: the split's corpus (every video of `source.corpus`) is encoded once with the
task's `encode_context` and stored (`vcmr.CorpusWriter`) in
`workdir/corpus/<name>_step<N>/`; the queries with `encode_query`; then
`vcmr.search` and `vcmr.submission` write the TVR submission JSON to
`workdir/moments/<name>_step<N>.json`. When the split has ground truth it is
scored with `metrics.vcmr.evaluate_predictions` (the official
standalone_eval/eval.py numbers): metrics `VCMR/0.5-r1`, ..., `SVMR/...`,
`VR/r1`, ..., by query type (`VCMR_by_type/v-0.5-r1`, ...), and
`VCMR/r1_sum` = R@1 IoU 0.5 + R@1 IoU 0.7, the official early-stopping score.
"""
import dataclasses
import json
import pathlib
import shutil
import tempfile
from typing import Any

import jax
import numpy as np

from avtext import atomic
from avtext import evals
from avtext.evals import base
from avtext.evals import protocols
from avtext.inference import vcmr
from avtext.metrics import vcmr as metrics

TASKS = ("VCMR", "SVMR", "VR")


def flatten(results: dict[str, dict]) -> dict[str, float]:
  """evaluate_predictions' nested dict -> {"VCMR/0.5-r1": pct, ...} (numbers only)."""
  out = {}
  for task, table in results.items():
    for key, value in table.items():
      if isinstance(value, (int, float)):
        out[f"{task}/{key}"] = float(value)
  if "VCMR/0.5-r1" in out and "VCMR/0.7-r1" in out:
    out["VCMR/r1_sum"] = out["VCMR/0.5-r1"] + out["VCMR/0.7-r1"]
  return out


def random_predictions(store: vcmr.CorpusStore, num_queries: int, own_video, cfg, *,
                       seed: int = 0, n: int = 100) -> dict[str, list]:
  """`search`-shaped results of the random baseline: per query, the corpus in a random
  order (VR), one random span per video under the length prior (VCMR), and n random
  spans on the query's own video (SVMR)."""
  rng = np.random.default_rng(seed)
  lengths = np.asarray(store.meta["num_clips"])

  def span(row):
    clips = max(int(lengths[row]), 1)
    length = int(rng.integers(min(cfg.min_len, clips), min(cfg.max_len, clips) + 1))
    start = int(rng.integers(0, clips - length + 1))
    return start, start + length - 1

  out = {"VR": [], "VCMR": [], "SVMR": []}
  for i in range(num_queries):
    rows = rng.permutation(len(store))[:n]
    out["VR"].append([[int(r), float(n - j) / n] for j, r in enumerate(rows)])
    out["VCMR"].append([[int(r), *span(r), float(n - j)] for j, r in enumerate(rows)])
    own = own_video[i]
    out["SVMR"].append(None if own is None else
                       [[int(own), *span(own), float(n - j)] for j in range(n)])
  return out


def search_config(cfg, name: str, **overrides) -> vcmr.SearchConfig:
  """`vcmr.SearchConfig` of the evaluator config `cfg` (`config.evals.<name>`): its `search`
  fields, then `overrides`; an unknown field is a ValueError naming it."""
  fields = {f.name for f in dataclasses.fields(vcmr.SearchConfig)}
  given = {**dict(cfg.get("search") or {}), **overrides}
  unknown = sorted(set(given) - fields)
  if unknown:
    raise ValueError(f"config.evals.{name}.search: unknown field(s) {unknown}; "
                     f"expected some of {sorted(fields)}")
  return vcmr.SearchConfig(**given)


def run_search_config(config, **overrides) -> vcmr.SearchConfig:
  """How a run searches a corpus: the `search` fields of its first `moments` evaluator
  (`search_config`; the defaults when it has none), then `overrides`."""
  for name, cfg in (config.get("evals") or {}).items():
    if cfg.get("type") == "moments":
      return search_config(cfg, name, **overrides)
  return search_config({}, "search", **overrides)


@evals.register_evaluator("moments")
class VCMREvaluator(base.Evaluator):
  """Encodes the corpus, answers the split's queries, writes and scores the submission."""

  protocol = protocols.Corpus
  fixed_predict_fns = ("encode_query", "encode_context", "span_logits")

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.search_cfg = search_config(self.cfg, self.name)
    self._baselines = None
    self._span_fn = None

  def _convse_reads_padding(self) -> bool:
    """XML's official ConvSE (model.masked_convse False) reads H_1 at padded clips: the
    store keeps them, so VCMR scores the model's own span logits (avtext/models/xml.py)."""
    model = self.task.config.model
    return (model.get("span_head") or "convse") == "convse" and not model.get("masked_convse")

  def encode_corpus(self, variables, *, mesh, directory, step: int | None = None
                    ) -> vcmr.CorpusStore:
    """The split's corpus through `encode_context`, stored in `directory`, with the run
    and `step` that encoded it (`CorpusStore.encoded_by`)."""
    source = self.source
    fn = self.cache.predict_fn("encode_context")
    jitted = self.cache.jitted(("moments_context", fn), mesh, lambda: fn)
    examples = self.task.corpus_examples(source)
    out, host = base.map_examples(lambda batch: jitted(variables, batch), examples,
                                  len(source.corpus), mesh=mesh,
                                  global_batch_size=self.batch_size)
    writer = vcmr.CorpusWriter(directory, num_videos=len(source.corpus),
                               streams=self.task.streams, dim=out["h0"].shape[-1],
                               max_len=out["h0"].shape[-2],
                               dtype=self.cfg.get("corpus_dtype", "float32"),
                               clip_length=source.clip_length,
                               keep_padded_h1=self._convse_reads_padding(),
                               encoded_by={"workdir": str(pathlib.Path(self.workdir).absolute())
                                           if self.workdir else None, "step": step})
    writer.add(host["vid_name"], [int(i) for i in host["video_idx"]], np.asarray(out["h0"]),
               np.asarray(out["h1"]), np.asarray(out["mask"]))
    return writer.close()

  @property
  def span_fn(self):
    """`(variables, q, h1, mask) -> logits`, one object per run (vcmr.search jits it)."""
    if self._span_fn is None:
      fn = self.cache.predict_fn("span_logits")
      self._span_fn = lambda v, q, h1, mask: fn(v, {"q": q, "h1": h1, "mask": mask})
    return self._span_fn

  def evaluate(self, variables, *, mesh, step: int) -> dict[str, Any]:
    source = self.source
    root = pathlib.Path(self.workdir) if self.workdir else None
    corpus_dir = (root / "corpus" / f"{self.name}_step{step}" if root
                  else pathlib.Path(tempfile.mkdtemp(prefix="avtext_corpus_")))
    store = self.encode_corpus(variables, mesh=mesh, directory=corpus_dir, step=step)
    fn = self.cache.predict_fn("encode_query")
    out, host = self.predict(("moments_query", fn), lambda: fn, variables, mesh=mesh)
    queries = [{"desc_id": int(d) if d.lstrip("-").isdigit() else d, "desc": t}
               for d, t in zip(host["desc_id"], host["desc"])]
    row_of = {v: i for i, v in enumerate(store.videos)}
    own = [row_of.get(v) if v else None for v in host["vid_name"]]
    cfg = self.search_cfg
    results = vcmr.search(store, np.asarray(out["q"]), self.span_fn, cfg, params=variables,
                          own_video=own)
    sub = vcmr.submission(store, results, queries, alpha=cfg.alpha)
    path = self._write(sub, step)
    summary: dict[str, Any] = {"num_queries": len(queries), "num_videos": len(store)}
    if source.has_ground_truth:
      gt = [source.describe(i) for i in range(len(source))]
      gt = [{"desc_id": q["desc_id"], "vid_name": q["vid_name"], "ts": q["ts"],
             "type": q["type"]} for q in gt]
      summary.update(flatten(metrics.evaluate_predictions(sub, gt)))
      if self._baselines is None:
        self._baselines = {}
        for name, bcfg in (self.cfg.get("baselines") or {}).items():
          if name != "random":
            raise ValueError(f"config.evals.{self.name}.baselines: unknown {name!r}; "
                             "expected 'random'")
          rand = random_predictions(store, len(queries), own, cfg,
                                    seed=int((bcfg or {}).get("seed", 0)))
          rand_sub = vcmr.submission(store, rand, queries, alpha=0.0)
          self._write(rand_sub, step, suffix=f"_{name}")
          self._baselines[name] = flatten(metrics.evaluate_predictions(rand_sub, gt))
      for name, table in self._baselines.items():
        summary.update({f"{name}/{k}": v for k, v in table.items()})
    if not self.cfg.get("keep_corpus", True) or root is None:
      shutil.rmtree(corpus_dir, ignore_errors=True)
    summary["submission"] = str(path) if path else ""
    summary["upload"] = self.package_submission(step, path)
    return summary

  def _write(self, sub: dict, step: int, suffix: str = "") -> pathlib.Path | None:
    if self.workdir is None or jax.process_index() != 0:
      return None
    out = pathlib.Path(self.workdir) / "moments"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{self.name}_step{step}{suffix}.json"
    atomic.write_text(path, json.dumps(sub))  # whole or not at all
    return path

  def report(self, results: dict, step: int) -> None:
    lines = [f"== {self.name}: moments, step {step}, {results['num_queries']} queries, "
             f"corpus of {results['num_videos']} videos =="]
    if results.get("upload"):
      lines.append(f"to upload (TVR's evaluation server): {results['upload']}")
    if "VCMR/0.5-r1" not in results:
      lines.append(f"(no ground truth: submission written to {results.get('submission')})")
      print("\n".join(lines), flush=True)
      return
    ks = (1, 5, 10, 100)
    header = " " * 18 + "".join(f"R@{k:<7d}" for k in ks)
    lines.append(header)
    prefixes = [""] + sorted({k.split("/")[0] + "/" for k in results
                              if k.count("/") == 2 and not k.startswith(TASKS)})
    for prefix in prefixes:
      for task in TASKS:
        thds = (None,) if task == "VR" else (0.5, 0.7)
        for thd in thds:
          key = "r" if thd is None else f"{thd}-r"
          vals = [results.get(f"{prefix}{task}/{key}{k}") for k in ks]
          if vals[0] is None:
            continue
          label = f"{prefix or 'XML/'}{task}" + ("" if thd is None else f" {thd}")
          lines.append(f"{label:<18s}" + "".join(f"{v:<9.2f}" for v in vals))
    for task in ("VCMR",):
      parts = [f"{t}: {results.get(f'{task}_by_type/{t}-0.7-r1', float('nan')):.2f}"
               for t in ("v", "t", "vt")]
      lines.append(f"{task} R@1 IoU0.7 by query type: " + ", ".join(parts))
    print("\n".join(lines), flush=True)
