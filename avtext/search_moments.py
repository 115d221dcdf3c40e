r"""Search the moments of a stored corpus with an XML run (TVR video corpus moment retrieval).

    python -m avtext.search_moments --workdir=workdirs/demo/xml --step=best \
        --corpus=workdirs/demo/xml/corpus/test_step840 --queries=queries.txt [--top=10]
    echo "Alice : we should talk about the weather" | python -m avtext.search_moments \
        --workdir=workdirs/demo/xml --corpus=... --queries=-

The corpus is a store written by the `moments` evaluator (`workdir/corpus/<eval>_step<N>/`,
kept with `keep_corpus=True`) or by `avtext.inference.vcmr.CorpusWriter`; it must come
from the same run and step (the encodings depend on the weights). Each query line is
encoded by the XML task's `encode_text`, as the query features were written
(`config.dataset.query_encoder`: a local HF BERT directory, default the offline
MiniLM-L6, and its hidden state, default -2; tokens without [CLS] / [SEP],
L2-normalized), then answered by `vcmr.search` (VR over the whole corpus, eq. 8 on the
top videos) with the run's moments evaluator's search settings. Prints, per query,
rank, video, start-end seconds, score; `--json` prints one JSON object per query instead.
"""
import copy
import json
import os
import sys
import types
from typing import Sequence

from absl import flags
import numpy as np

from avtext import cli
from avtext import errors
from avtext import runs as runs_lib
from avtext.evals import vcmr as vcmr_eval
from avtext.inference import vcmr
from avtext.tasks import task_registry


def check_corpus(store: vcmr.CorpusStore, run, corpus) -> None:
  """The corpus' encodings must come from `run` at its step (they depend on the weights):
  another step or run is `errors.BadInput` naming both and the fix."""
  by = store.encoded_by
  if by.get("workdir") and os.path.realpath(by["workdir"]) != os.path.realpath(run.workdir):
    raise errors.BadInput(f"--corpus={corpus}: encoded by the run {by['workdir']}, not "
                          f"--workdir={run.workdir}; search it with that run, or encode the "
                          "corpus with this one (--mode=eval, keep_corpus=True)")
  if by.get("step") is not None and int(by["step"]) != run.step:
    raise errors.BadInput(f"--corpus={corpus}: encoded at step {by['step']}, but the run is "
                          f"loaded at step {run.step} (--step): the scores would mix two "
                          f"models; pass --step={by['step']}, or encode the corpus at step "
                          f"{run.step} (--mode=eval, keep_corpus=True)")


class Searcher:
  """A run + a stored corpus: `__call__(texts) -> per query, [(vid_name, st, ed, score)]`.

  The queries go through the XML task's `encode_text` (`avtext.tasks.xml`); `bert_dir` /
  `layer` replace the run's `config.dataset.query_encoder` fields, `search` its moments
  evaluator's search fields (`avtext.evals.vcmr.run_search_config`)."""

  def __init__(self, workdir, corpus, *, step=None, bert_dir=None, layer=None,
               search: dict | None = None):
    self.run = runs_lib.load_run(workdir, step)
    config, model = self.run.config, self.run.model
    if config.model.name != "xml":
      raise errors.BadInput(f"{workdir}: a {config.model.name!r} run; avtext.search_moments "
                            "needs an XML run (configs/xml_tvr.py)")
    self.store = vcmr.CorpusStore(corpus)
    check_corpus(self.store, self.run, corpus)
    streams = tuple(model.context.split("_"))
    if self.store.streams != streams:
      raise errors.BadInput(f"{corpus}: streams {self.store.streams} but the run's context is "
                       f"{model.context!r}: encode the corpus with this run")
    if bert_dir or layer is not None:
      config = copy.deepcopy(config)
      with config.unlocked():
        enc = dict(config.dataset.get("query_encoder") or {})
        config.dataset.query_encoder = {**enc, **({"bert_dir": bert_dir} if bert_dir else {}),
                                        **({} if layer is None else {"layer": layer})}
    self.task = task_registry.build_task(config)
    self._encode_text = self.task.predict_fns()["encode_text"]
    self.cfg = vcmr_eval.run_search_config(config, **(search or {}))
    self._span = lambda v, q, h1, m: model.apply(v, q, h1, m, method=model.span_logits)

  def encode(self, texts: Sequence[str]) -> np.ndarray:
    out = self._encode_text(self.run.variables, {"text": list(texts)})
    for i, (t, tokens, kept) in enumerate(zip(texts, out["tokens"], out["kept"])):
      if tokens > kept:
        cli.note_cut(f"query {i + 1} ({len(t)} characters)", int(tokens), int(kept),
                     "the query encoder and the run's max_query_len")
    return out["q"]

  def __call__(self, texts: Sequence[str], top: int = 10) -> list[list[tuple]]:
    results = vcmr.search(self.store, self.encode(texts), self._span, self.cfg,
                          params=self.run.variables)
    cl = self.store.clip_length
    return [[(self.store.videos[v], s * cl, (e + 1) * cl, score)
             for v, s, e, score in results["VCMR"][i][:top]] for i in range(len(texts))]


FLAGS = flags.FlagValues()
_WORKDIR = cli.DEFINE_path("workdir", None, "an XML run directory", flag_values=FLAGS)
_STEP = cli.DEFINE_checkpoint_step(FLAGS)
_CORPUS = cli.DEFINE_path("corpus", None, "a corpus store of that run and step "
                          "(workdir/corpus/<eval>_step<N>)", flag_values=FLAGS)
_QUERIES = cli.DEFINE_path("queries", None, "a text file, one query per line; - reads "
                           "standard input", flag_values=FLAGS)
_TOP = flags.DEFINE_integer("top", 10, "moments per query", lower_bound=1, flag_values=FLAGS)
_BERT_DIR = cli.DEFINE_path("bert_dir", None, "a local HF BERT directory for the queries "
                            "(default: the run's config.dataset.query_encoder)",
                            flag_values=FLAGS)
_JSON = flags.DEFINE_bool("json", False, "print one JSON object per query", flag_values=FLAGS)
flags.mark_flags_as_required(["workdir", "corpus", "queries"], flag_values=FLAGS)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise errors.BadInput(f"unexpected arguments {list(argv[1:])}: the queries come from "
                          "--queries (a file, or - for standard input)")
  if not os.path.isdir(_CORPUS.value):
    raise errors.InputNotFound(f"--corpus={_CORPUS.value}: no such directory; the moments "
                               "evaluator writes it under workdir/corpus/ (keep_corpus=True)")
  cli.check_input_dir("workdir", _WORKDIR.value, "XML run directory")
  if _BERT_DIR.value:
    cli.check_input_dir("bert_dir", _BERT_DIR.value, "HF BERT directory")
  if _QUERIES.value == "-":
    if sys.stdin.isatty():
      raise errors.BadInput("--queries=-: type the queries, one per line, then Ctrl-D; or "
                            "pipe them in, or pass --queries=FILE")
    texts = [line.strip() for line in sys.stdin if line.strip()]
    if not texts:
      raise errors.BadInput("--queries=-: no queries in it")
  else:
    texts = cli.read_lines("queries", _QUERIES.value, "query", "queries")
  step = cli.parse_step(_STEP.value)
  if isinstance(step, int) and os.path.isfile(os.path.join(_CORPUS.value, "meta.json")):
    # A corpus of another step is refused before the run is read (Searcher checks again).
    check_corpus(vcmr.CorpusStore(_CORPUS.value),
                 types.SimpleNamespace(workdir=_WORKDIR.value, step=step), _CORPUS.value)
  searcher = Searcher(_WORKDIR.value, _CORPUS.value, step=step, bert_dir=_BERT_DIR.value)
  for text, moments in zip(texts, searcher(texts, top=_TOP.value)):
    if _JSON.value:
      print(json.dumps({"query": text, "moments": [
          {"vid_name": v, "st": round(s, 2), "ed": round(e, 2), "score": sc}
          for v, s, e, sc in moments]}))
      continue
    print(f"query: {text}")
    for rank, (vid, s, e, score) in enumerate(moments, 1):
      print(f"  {rank:3d}. {vid}  {s:7.1f} - {e:7.1f} s   score {score:.4g}")


if __name__ == "__main__":
  cli.run(main, FLAGS)
