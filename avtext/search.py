r"""Search with a trained run: your own videos by text (or by video), or an XML moment corpus.

Videos indexed by `python -m avtext.index` (a retrieval run, e.g. configs/videocc_avr.py):

    python -m avtext.search --index=INDEX "a dog barking at a red ball" [--top=5] [--json]
    python -m avtext.search --index=INDEX --video=FILE --captions=captions.txt [--top=5]

text -> video prints, per query, rank, score and the video's path (relative to the
indexed folder); the score is the retrieval evaluator's (VideoCC §4.1): the text's
similarity with each of the video's K clips, averaged, i.e. the text embedding (the run's
tokenizer and text tower) times the mean clip embedding the index stores. video -> text
embeds FILE as the index embeds a video and ranks the lines of --captions by the same
score. The run and step are the index's (meta.json); `--json` prints one JSON object
per query.

Moments of a stored corpus with an XML run (TVR):

    python -m avtext.search --workdir=workdirs/demo/xml --step=best \
        --corpus=workdirs/demo/xml/corpus/test_step840 --queries=queries.txt [--top=10]
    echo "Alice : we should talk about the weather" | python -m avtext.search \
        --workdir=workdirs/demo/xml --corpus=... --queries=-

The corpus is a store written by the `moments` evaluator (`workdir/corpus/<eval>_step<N>/`,
kept with `keep_corpus=True`) or by `avtext.inference.vcmr.CorpusWriter`; it must come
from the same run and step (the encodings depend on the weights). Each query line is
encoded as the query features were (`config.dataset.query_encoder`: a local HF BERT
directory, default the offline MiniLM-L6, and its hidden state, default -2; tokens
without [CLS] / [SEP], L2-normalized), then answered by `vcmr.search` (VR over the whole
corpus, eq. 8 on the top videos). Prints, per query, rank, video, start-end seconds,
score; `--json` prints one JSON object per query instead.
"""
import argparse
import json
import sys
from typing import Sequence

import jax
import numpy as np

from avtext import index as index_lib
from avtext import runs as runs_lib
from avtext.data import text_features
from avtext.data.builders import tvr
from avtext.inference import vcmr
from avtext.tools import tvr_text_features


class Searcher:
  """A run + a stored corpus: `__call__(texts) -> per query, [(vid_name, st, ed, score)]`."""

  def __init__(self, workdir, corpus, *, step=None, bert_dir=None, layer=None,
               search: dict | None = None):
    self.run = runs_lib.load_run(workdir, step)
    config, model = self.run.config, self.run.model
    if config.model.name != "xml":
      raise ValueError(f"{workdir}: a {config.model.name!r} run; avtext.search needs an XML run")
    self.store = vcmr.CorpusStore(corpus)
    streams = tuple(model.context.split("_"))
    if self.store.streams != streams:
      raise ValueError(f"{corpus}: streams {self.store.streams} but the run's context is "
                       f"{model.context!r}: encode the corpus with this run")
    enc = dict(config.dataset.get("query_encoder") or {})
    self.encoder = text_features.TextEncoder(bert_dir or enc.get("bert_dir"),
                                             (layer if layer is not None
                                              else enc.get("layer", -2),))
    self.normalize = bool(config.dataset.get("normalize_text", True))
    evals = config.get("evals") or {}
    defaults = next((dict(e.get("search") or {}) for e in evals.values()
                     if e.get("type") == "moments"), {})
    self.cfg = vcmr.SearchConfig(**{**defaults, **(search or {})})
    variables = self.run.variables
    self._query = jax.jit(lambda q, m: model.apply(variables, q, m, method=model.encode_query))
    self._span = lambda v, q, h1, m: model.apply(v, q, h1, m, method=model.span_logits)

  def encode(self, texts: Sequence[str]) -> np.ndarray:
    ids = {str(i): self.encoder.sentence_ids(t, tvr_text_features.MAX_QUERY_TOKENS)
           for i, t in enumerate(texts)}
    feats = self.encoder.run(ids, desc="queries")
    max_len = self.run.model.max_query_len
    q = np.zeros((len(texts), max_len, self.encoder.dim), np.float32)
    mask = np.zeros((len(texts), max_len), np.int32)
    for i in range(len(texts)):
      x = feats[str(i)][1:-1] if len(feats[str(i)]) > 2 else feats[str(i)]
      x = tvr.l2_normalize(x) if self.normalize else x
      q[i, :len(x[:max_len])], mask[i, :len(x[:max_len])] = x[:max_len], 1
    return np.asarray(self._query(q, mask))

  def __call__(self, texts: Sequence[str], top: int = 10) -> list[list[tuple]]:
    results = vcmr.search(self.store, self.encode(texts), self._span, self.cfg,
                          params=self.run.variables)
    cl = self.store.clip_length
    return [[(self.store.videos[v], s * cl, (e + 1) * cl, score)
             for v, s, e, score in results["VCMR"][i][:top]] for i in range(len(texts))]


class IndexSearcher:
  """An `avtext.index` directory + its run: `texts(queries, top)` -> per query
  [(video, score)], `video(file, captions, top)` -> [(caption, score)]; best first.
  `embedder`: the index's run already loaded (`index.VideoEmbedder`), else it is loaded."""

  def __init__(self, index, embedder=None):
    self.index = index_lib.VideoIndex(index)
    run = self.index.meta["run"]
    if index_lib.config_hash(run["workdir"]) != run["config_sha256"]:
      raise ValueError(f"{index}: the run {run['workdir']} changed since it was indexed "
                       "(config.json differs); index again")
    self.embedder = embedder or index_lib.VideoEmbedder(run["workdir"], run["step"])
    if self.embedder.identity != run:
      raise ValueError(f"{index}: indexed with {run}, not {self.embedder.identity}")

  def texts(self, queries: Sequence[str], top: int = 5) -> list[list[tuple[str, float]]]:
    scores, rows = self.index.search(self.embedder.embed_texts(queries), top)
    return [[(self.index.ids[r], float(sc)) for sc, r in zip(s, rr) if r >= 0]
            for s, rr in zip(scores, rows)]

  def video(self, path: str, captions: Sequence[str], top: int = 5
            ) -> list[tuple[str, float]]:
    source = self.embedder.source([path], [path], path, progress=False)
    if not len(source):
      s = source.skipped[0]
      raise ValueError(f"{path}: cannot be read ({s.reason} {s.detail})")
    vectors, failed = self.embedder.embed_videos(source, progress=False)
    if failed:
      raise failed[0]
    sim = self.embedder.embed_texts(captions) @ vectors[0]
    order = np.argsort(-sim, kind="stable")[:top]
    return [(captions[i], float(sim[i])) for i in order]


def _index_main(args, parser) -> None:
  if args.workdir or args.corpus or args.step:
    parser.error("--index: the run and step are the index's (meta.json); --workdir, "
                 "--corpus and --step are for XML moment search")
  if args.video:
    if args.text or not args.captions:
      parser.error("--video ranks the lines of --captions=FILE; give no text queries")
    captions = [l.strip() for l in open(args.captions, encoding="utf-8") if l.strip()]
    if not captions:
      parser.error(f"--captions={args.captions}: no captions in it")
    found = IndexSearcher(args.index).video(args.video, captions, args.top)
    if args.json:
      print(json.dumps({"video": args.video, "captions": [
          {"caption": c, "score": sc} for c, sc in found]}))
    else:
      print(f"video: {args.video}")
      for rank, (c, sc) in enumerate(found, 1):
        print(f"  {rank:3d}. {sc:8.4f}  {c}")
    return
  if not args.text:
    parser.error('give a query: python -m avtext.search --index=INDEX "text"')
  for text, found in zip(args.text, IndexSearcher(args.index).texts(args.text, args.top)):
    if args.json:
      print(json.dumps({"query": text, "videos": [{"video": v, "score": sc}
                                                   for v, sc in found]}))
      continue
    print(f"query: {text}")
    for rank, (v, sc) in enumerate(found, 1):
      print(f"  {rank:3d}. {sc:8.4f}  {v}")


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="python -m avtext.search",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--index", default=None, help="an avtext.index directory (own videos)")
  parser.add_argument("text", nargs="*", help="--index: text queries")
  parser.add_argument("--video", default=None, help="--index: a video file, video -> text")
  parser.add_argument("--captions", default=None, help="--video: captions, one per line")
  parser.add_argument("--workdir", default=None, help="an XML run directory")
  parser.add_argument("--step", default=None, help="checkpoint: N, 'best' or latest (default)")
  parser.add_argument("--corpus", default=None, help="a corpus store of that run and step")
  parser.add_argument("--queries", default="-", help="a text file, one query per line; - = stdin")
  parser.add_argument("--top", type=int, default=None,
                      help="results per query (default 5 videos / 10 moments)")
  parser.add_argument("--bert_dir", default=None, help="overrides config.dataset.query_encoder")
  parser.add_argument("--json", action="store_true", help="one JSON object per query")
  args = parser.parse_args(argv)
  if args.index:
    args.top = args.top or 5
    _index_main(args, parser)
    return
  if not args.workdir or not args.corpus:
    parser.error("give --index=INDEX (own videos) or --workdir and --corpus (XML moments)")
  if args.text or args.video or args.captions:
    parser.error("XML moment search reads its queries from --queries (a file or - for "
                 "stdin); text arguments, --video and --captions go with --index")
  args.top = args.top or 10
  lines = (sys.stdin if args.queries == "-" else open(args.queries, encoding="utf-8"))
  texts = [l.strip() for l in lines if l.strip()]
  if not texts:
    parser.error("no queries given")
  searcher = Searcher(args.workdir, args.corpus, step=index_lib.parse_step(args.step),
                      bert_dir=args.bert_dir)
  for text, moments in zip(texts, searcher(texts, top=args.top)):
    if args.json:
      print(json.dumps({"query": text, "moments": [
          {"vid_name": v, "st": round(s, 2), "ed": round(e, 2), "score": sc}
          for v, s, e, sc in moments]}))
      continue
    print(f"query: {text}")
    for rank, (vid, s, e, score) in enumerate(moments, 1):
      print(f"  {rank:3d}. {vid}  {s:7.1f} - {e:7.1f} s   score {score:.4g}")


if __name__ == "__main__":
  main()
