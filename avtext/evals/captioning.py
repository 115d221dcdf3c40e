"""Captioning evaluator (`type="captioning"`).

Config fields (besides `base.Evaluator`'s):
  captions_fn   the task's predict function giving {"tokens": [B, T], ...}
                (default "captions"); the task's `decode` turns tokens to text
  baselines     optional, computed once per run on the same split and scored
                the same way:
                  most_frequent: {num_train}: the most frequent caption among
                    the first num_train training captions, for every clip
                  nearest_neighbour: {run, step, num_train, num_clips}: the
                    caption of the training clip nearest to each test clip
                    under the video embedding of another run (an AVR run's
                    `embed_video`, averaged over its K test clips; num_clips
                    overrides K), among the first num_train

Metrics (`avtext.metrics.captioning.caption_metrics`, pycocoevalcap's
scale): BLEU-1..4, METEOR, ROUGE-L, CIDEr-D. References are the split's
captions; when examples carry a `video_id` (several captions per video,
MSR-VTT), they are grouped per video and each video is captioned once. On a
source that knows its clips' ground truth (`avtext.data.ground_truth.of_source`:
a world that made its clips, or files it wrote), `attribute_precision` / `attribute_recall`
(its `caption_scores`): the share of the attributes a generated caption names
that its clip has, and the share of the clip's attributes it names; the
ground-truth captions' own values are reported as `reference/...` for scale.
Other sources report neither. An empty generation is scored as the
one-word caption "<empty>" and counted (`num_empty`).

Predictions go to `workdir/captions/<name>_step<step>.json` in the COCO
result format, [{"image_id": <clip id>, "caption": ...}], or with
`output_format="tvc"` to `<name>_step<step>.jsonl` in TVCaption's submission
format, one line per moment {"descs": [{"desc": ...}], "clip_id", "ts",
"vid_name"} (what its standalone_eval/evaluate.py scores), with the
baselines' next to them. Examples that carry `references` (all the
descriptions of a TVC moment) are scored against them, one caption each; a
split without any (TVC's released test_public) is captioned and written, not
scored.
"""
import collections
import functools
import json
from typing import Any

import jax
import numpy as np

from avtext import atomic
from avtext import evals
from avtext.data import ground_truth
from avtext.data import pipelines
from avtext.evals import base
from avtext.evals import protocols
from avtext.metrics import captioning as metrics

EMPTY = "<empty>"


def _attributes(host: dict) -> list[dict] | None:
  values = host.get("attributes")
  if not values or any(v in (None, "None") for v in values):
    return None
  return [json.loads(v) for v in values]


def _write_coco(path, texts: list[str], ids: list[str]) -> None:
  rows = [{"image_id": k, "caption": t} for k, t in zip(ids, texts)]
  atomic.write_text(path, json.dumps(rows, indent=0))  # whole or not at all


def _write_tvc(path, texts: list[str], ids: list[str], *, host: dict, keep: list[int]) -> None:
  """TVCaption's submission jsonl: {"descs": [{"desc"}], "clip_id", "ts", "vid_name"}."""
  lines = []
  for row, text, clip_id in zip(keep, texts, ids, strict=True):
    lines.append(json.dumps({"descs": [{"desc": text}],
                             "clip_id": int(clip_id) if clip_id.isdigit() else clip_id,
                             "ts": host["ts"][row], "vid_name": host["vid_name"][row]}))
  atomic.write_text(path, "".join(line + "\n" for line in lines))


@evals.register_evaluator("captioning")
class CaptioningEvaluator(base.Evaluator):
  """Generates a caption per test video and scores it against the references."""

  protocol = protocols.Captioning
  predict_fn_keys = {"captions_fn": "captions"}

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self._baselines = None
    nearest = (self.cfg.get("baselines") or {}).get("nearest_neighbour")
    if nearest and not nearest.get("run"):  # known now, not after training
      raise ValueError(f"config.evals.{self.name}.baselines.nearest_neighbour.run is not set: "
                       "set it to the run directory of a retrieval model (e.g. "
                       "workdirs/demo/avr), which the baseline embeds the clips with")

  def evaluate(self, variables, *, mesh, step: int) -> dict[str, Any]:
    fn = self.cache.predict_fn(self.predict_fn_name("captions_fn"))
    out, host = self.predict(("captioning", fn), lambda: fn, variables, mesh=mesh)
    hypotheses = self.task.decode(out["tokens"])
    ids, refs, keep = self._references(host)
    hyps = {ids[i]: hypotheses[i] for i in keep}
    if not any(refs.values()):  # e.g. TVC's released test_public: a submission file only
      export = self._write(step, hyps, ids, keep, host)
      return {"num_videos": len(hyps), "num_empty": sum(not h.strip() for h in hyps.values()),
              "upload": self.package_submission(step, export)}
    if not all(refs.values()):
      raise ValueError(f"config.evals.{self.name}: {sum(not r for r in refs.values())} of "
                       f"{len(refs)} items have no reference caption")
    results = self._score(refs, hyps, host, keep)
    results["mean_length_tokens"] = float(np.mean(np.asarray(out["lengths"])[keep]))
    if self._baselines is None:
      self._baselines = self._compute_baselines(host, keep, ids, mesh=mesh)
    for name, texts in self._baselines.items():
      scored = self._score(refs, dict(zip([ids[i] for i in keep], texts)), host, keep)
      results.update({f"{name}/{k}": v for k, v in scored.items()})
    truth, attrs = self._truth(host)
    if attrs is not None:
      ref = truth.caption_scores([refs[ids[i]][0] for i in keep], [attrs[i] for i in keep])
      results.update({f"reference/{k}": v for k, v in ref.items()})
    export = self._write(step, hyps, ids, keep, host)
    results["upload"] = self.package_submission(step, export)
    return results

  def _references(self, host: dict) -> tuple[list[str], dict, list[int]]:
    """(id per example, {id: [references]}, rows to caption: one per video)."""
    if "references" in host:  # one example per item with all its references (TVC)
      ids = list(host["clip_id"])
      if len(set(ids)) != len(ids):
        raise ValueError(f"config.evals.{self.name}: clip ids are not unique")
      return ids, {i: list(r) for i, r in zip(ids, host["references"])}, list(range(len(ids)))
    captions = host["caption"]
    videos = host.get("video_id")
    if videos is None:
      ids = list(host["clip_id"])
      if len(set(ids)) != len(ids):
        raise ValueError(f"config.evals.{self.name}: clip ids are not unique")
      return ids, {i: [c] for i, c in zip(ids, captions)}, list(range(len(ids)))
    refs = collections.defaultdict(list)
    first = {}
    for row, (vid, cap) in enumerate(zip(videos, captions)):
      refs[vid].append(cap)
      first.setdefault(vid, row)
    return list(videos), dict(refs), sorted(first.values())

  def _score(self, refs: dict, hyps: dict, host: dict, keep: list[int]) -> dict[str, Any]:
    empty = sum(not h.strip() for h in hyps.values())
    hyps = {k: (h if h.strip() else EMPTY) for k, h in hyps.items()}
    results = metrics.caption_metrics({k: refs[k] for k in hyps}, hyps)
    results["num_empty"] = empty
    results["num_videos"] = len(hyps)
    truth, attrs = self._truth(host)
    if attrs is not None:
      results.update(truth.caption_scores(list(hyps.values()), [attrs[i] for i in keep]))
    return results

  def _truth(self, host: dict) -> tuple[ground_truth.ClipTruth | None, list[dict] | None]:
    """(the source's ground truth, every example's attributes), or (None, None) when the
    source knows none or an example lacks its attributes."""
    truth = ground_truth.of_source(self.source)
    attrs = _attributes(host) if truth is not None else None
    return (truth, attrs) if attrs is not None else (None, None)

  def _compute_baselines(self, host: dict, keep: list[int], ids: list[str], *,
                         mesh) -> dict[str, list[str]]:
    cfg = self.cfg.get("baselines") or {}
    out = {}
    if cfg.get("most_frequent"):
      train = self.task.train_captions(int(cfg.most_frequent.num_train))
      counts = collections.Counter(train)
      best = max(counts.values())
      top = next(c for c in train if counts[c] == best)  # ties: the earliest
      out["baseline_most_frequent"] = [top] * len(keep)
    if cfg.get("nearest_neighbour"):
      out["baseline_nearest_neighbour"] = self._nearest_neighbour(cfg.nearest_neighbour, keep,
                                                                  mesh=mesh)
    return out

  def _nearest_neighbour(self, cfg, keep: list[int], *, mesh) -> list[str]:
    from avtext import runs  # pylint: disable=g-import-not-at-top
    run = runs.load_run(cfg.run, step=cfg.get("step"))
    if cfg.get("num_clips"):  # fewer test clips per video than the run evaluates with
      run.config.data.eval_num_clips = int(cfg.num_clips)
    task = run.task()
    embed = dict(task.predict_fns())[cfg.get("video_fn", "embed_video")]
    fn = jax.jit(embed)
    train_source = self.task.train_source
    n_train = min(int(cfg.num_train), len(train_source))

    def embed_split(source, n):
      emb, _ = base.map_examples(lambda b: fn(run.variables, b), task.eval_examples(source), n,
                                 mesh=mesh, global_batch_size=self.batch_size)
      emb = np.asarray(emb, np.float64)
      if emb.ndim == 3:  # [N, K, D]: VideoCC averages the K clips' similarities
        emb = emb.mean(axis=1)
      return emb

    train_emb = embed_split(train_source, n_train)
    test_emb = embed_split(self.source, len(self.source))[keep]
    nearest = np.argmax(test_emb @ train_emb.T, axis=1)
    train_captions = pipelines.source_captions(train_source, n_train)
    return [train_captions[j] for j in nearest]

  def _write(self, step: int, hyps: dict, ids: list[str], keep: list[int], host: dict):
    """The captions of `step` written (and the baselines'); returns their file, or None
    when this process writes nothing."""
    if self.workdir is None or jax.process_index() != 0:
      return None
    import pathlib  # pylint: disable=g-import-not-at-top
    folder = pathlib.Path(self.workdir) / "captions"
    folder.mkdir(parents=True, exist_ok=True)
    if self.cfg.get("output_format", "coco") == "tvc":
      write = functools.partial(_write_tvc, host=host, keep=keep)
      suffix = ".jsonl"
    elif self.cfg.get("output_format", "coco") == "coco":
      write, suffix = _write_coco, ".json"
    else:
      raise ValueError(f"config.evals.{self.name}.output_format="
                       f"{self.cfg.output_format!r}; expected 'coco' or 'tvc'")
    path = folder / f"{self.name}_step{step}{suffix}"
    write(path, [hyps[ids[i]] for i in keep], [ids[i] for i in keep])
    for name, texts in (self._baselines or {}).items():
      write(folder / f"{self.name}_{name}{suffix}", texts, [ids[i] for i in keep])
    return path

  def report(self, results: dict, step: int) -> None:
    names = ["BLEU-1", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr-D", "attribute_precision",
             "attribute_recall"]
    names = [n for n in names if n in results]
    rows = [("model", "")] + [(p.split("/")[0], p.split("/")[0] + "/")
                              for p in sorted({k.rsplit("/", 1)[0] for k in results
                                               if "/" in k})]
    # TVC captions moments (several per video): count them as such.
    items = "moments" if self.cfg.get("output_format") == "tvc" else "videos"
    lines = [f"== {self.name}: captioning, step {step}, {results['num_videos']} {items} "
             f"({results['num_empty']} empty) ==",
             f"{'':<28}" + "".join(f"{n.replace('attribute_precision', 'attr_prec').replace('attribute_recall', 'attr_rec'):>12}" for n in names)]
    for label, prefix in rows:
      values = [results.get(prefix + n) for n in names]
      scale = [1.0 if n.startswith("attribute") else 100.0 for n in names]
      lines.append(f"{label:<28}" + "".join(
          f"{v * s:12.2f}" if v is not None else f"{'-':>12}" for v, s in zip(values, scale)))
    lines.append("(BLEU/METEOR/ROUGE-L/CIDEr-D x 100; attribute precision/recall in %)")
    if results.get("upload"):
      lines.append(f"to upload (TVC's evaluation server): {results['upload']}")
    print("\n".join(lines), flush=True)
