r"""Search your own videos, indexed by `python -m avtext.index`, with the index's run.

    python -m avtext.search_videos --index=INDEX "a dog barking at a red ball" [--top=5]
    python -m avtext.search_videos --index=INDEX --video=FILE --captions=captions.txt

text -> video prints, per query, rank, score and the video's path (relative to the
indexed folder); the score is the retrieval evaluator's (VideoCC §4.1): the text's
similarity with each of the video's K clips, averaged, i.e. the text embedding (the run's
tokenizer and text tower) times the mean clip embedding the index stores. video -> text
embeds FILE as the index embeds a video and ranks the lines of --captions by the same
score. The run and step are the index's (meta.json); `--json` prints one JSON object
per query.
"""
import dataclasses
import json
from typing import Sequence

from absl import flags
import numpy as np

from avtext import cli
from avtext import errors
from avtext import index as index_lib


@dataclasses.dataclass(frozen=True)
class Hit:
  """A video found by a text: its id (path under the indexed folder), row, score, and
  the scores of its K clips (`index.clip_ranges` gives their times), or None."""
  video: str
  row: int
  score: float
  clip_scores: list[float] | None


class IndexSearcher:
  """An `avtext.index` directory + its run: `texts(queries, top)` -> per query
  [(video, score)], `video(file, captions, top)` -> [(caption, score)]; best first.
  `embedder`: the index's run already loaded (`index.VideoEmbedder`), else it is loaded."""

  def __init__(self, index, embedder=None):
    self.index = index_lib.VideoIndex(index)
    run = self.index.meta["run"]
    if index_lib.config_hash(run["workdir"]) != run["config_sha256"]:
      raise errors.BadInput(f"{index}: the run {run['workdir']} changed since it was "
                            "indexed (config.json differs); index again")
    self.embedder = embedder or index_lib.VideoEmbedder(run["workdir"], run["step"])
    if self.embedder.identity != run:
      mine = self.embedder.identity
      what = ("another model" if run["config_sha256"] != mine["config_sha256"]
              else "the same run at another step")
      raise errors.BadInput(f"{index}: built with {what} ({run['workdir']} step {run['step']}), "
                            f"not {mine['workdir']} step {mine['step']}; search it with "
                            "that run, or index the videos again with this one")

  def texts(self, queries: Sequence[str], top: int = 5) -> list[list[tuple[str, float]]]:
    return [[(h.video, h.score) for h in found] for found in self.hits(queries, top)]

  def hits(self, queries: Sequence[str], top: int = 5) -> list[list[Hit]]:
    """Per query, the top videos best first, each with the scores of its K clips (the
    video's score is their mean) when the index keeps them (clips.npy)."""
    self.embedder.note_cut_texts(queries)
    texts = self.embedder.embed_texts(queries)
    scores, rows = self.index.search(texts, top)
    clips = self.index.clips
    return [[Hit(self.index.ids[r], int(r), float(sc),
                 None if clips is None else [float(c) for c in np.asarray(clips[r]) @ t])
             for sc, r in zip(s, rr) if r >= 0] for t, s, rr in zip(texts, scores, rows)]

  def video(self, path: str, captions: Sequence[str], top: int = 5
            ) -> list[tuple[str, float]]:
    source = self.embedder.source([path], [path], path, progress=False)
    if not len(source):
      s = source.skipped[0]
      raise errors.BadInput(f"{path}: cannot be read ({s.reason}: {s.detail})")
    vectors, failed = self.embedder.embed_videos(source, progress=False)
    if failed:
      raise failed[0]
    self.embedder.note_cut_texts(captions, "caption")
    sim = self.embedder.embed_texts(captions) @ vectors[0]
    order = np.argsort(-sim, kind="stable")[:top]
    return [(captions[i], float(sim[i])) for i in order]



FLAGS = flags.FlagValues()
_INDEX = cli.DEFINE_path("index", None, "an avtext.index directory", flag_values=FLAGS)
_VIDEO = cli.DEFINE_path("video", None, "video -> text: a video file whose best captions "
                         "among --captions are printed", flag_values=FLAGS)
_CAPTIONS = cli.DEFINE_path("captions", None, "with --video: a text file, one caption per "
                            "line", flag_values=FLAGS)
_TOP = flags.DEFINE_integer("top", 5, "results per query", lower_bound=1, flag_values=FLAGS)
_JSON = flags.DEFINE_bool("json", False, "print one JSON object per query", flag_values=FLAGS)
flags.mark_flag_as_required("index", flag_values=FLAGS)


def main(argv: Sequence[str]) -> None:
  queries = list(argv[1:])
  if _VIDEO.value:
    if queries or not _CAPTIONS.value:
      raise errors.BadInput("--video ranks the lines of --captions=FILE; give no text queries")
    cli.check_input_file("video", _VIDEO.value, "video file")
    captions = cli.read_lines("captions", _CAPTIONS.value, "caption", "captions")
    found = IndexSearcher(_INDEX.value).video(_VIDEO.value, captions, _TOP.value)
    if _JSON.value:
      print(json.dumps({"video": _VIDEO.value, "captions": [
          {"caption": c, "score": sc} for c, sc in found]}))
    else:
      print(f"video: {_VIDEO.value}")
      for rank, (c, sc) in enumerate(found, 1):
        print(f"  {rank:3d}. {sc:8.4f}  {c}")
    return
  if _CAPTIONS.value:
    raise errors.BadInput("--captions goes with --video=FILE")
  if not queries:
    raise errors.BadInput('give a query: python -m avtext.search_videos --index=INDEX "text"')
  empty = [i for i, text in enumerate(queries, 1) if not text.strip()]
  if empty:
    raise errors.BadInput(f"query {empty[0]} is empty; give the text to search for")
  for text, found in zip(queries, IndexSearcher(_INDEX.value).texts(queries, _TOP.value)):
    if _JSON.value:
      print(json.dumps({"query": text, "videos": [{"video": v, "score": sc}
                                                   for v, sc in found]}))
      continue
    print(f"query: {text}")
    for rank, (v, sc) in enumerate(found, 1):
      print(f"  {rank:3d}. {sc:8.4f}  {v}")


if __name__ == "__main__":
  cli.run(main, FLAGS)
