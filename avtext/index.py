r"""Index a folder of your own videos with a trained retrieval run, for `avtext.search`.

    python -m avtext.index --run=workdirs/demo/avr [--step=best] --videos=~/my_videos \
        --out=~/my_videos.index

Every video under --videos (recursively; .mp4 .mkv .webm .avi .mov .m4v) is read through
`builders.files.MediaClips` with the run's `config.data` (fps, sample rate, frames
decoded at the model's image size) and embedded exactly as the retrieval evaluator
embeds a test video: `task.eval_examples` takes K = `data.eval_num_clips` clips spread
over the whole video (VideoCC §4.1), the run's `embed_video` encodes them, and -- since
the evaluator scores a caption by averaging its similarity with the K clips -- the mean
of the K clip embeddings is stored: its inner product with a text embedding is that
score. A progress bar counts the videos.

INDEX/ holds
  index.faiss    a FAISS inner-product index (exact) over the video vectors
  vectors.npy    the vectors, float32 [N, D], row i = ids[i]
  ids.json       the videos' paths relative to --videos
  meta.json      the run's identity (absolute workdir, step, sha256 of its config.json),
                 the videos directory, and the files skipped (path, reason) with counts
Bad files (missing, empty, unreadable, no video stream, shorter than 0.5 s, truncated)
are skipped, counted by reason and listed; a video without sound is indexed with
zeros for audio (has_audio False), as the evaluator feeds it.

Re-running with the same --out adds only files not yet indexed (skipped files are tried
again); an index belongs to one run and step: another --run/--step is an error.
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import json
import pathlib
import sys
from typing import Sequence

import numpy as np

from avtext.data import video_io
from avtext.data.builders import files

FORMAT = "avtext.video_index/1"
BATCH = 8


def config_hash(workdir: str | pathlib.Path) -> str:
  return hashlib.sha256((pathlib.Path(workdir) / "config.json").read_bytes()).hexdigest()


class VideoEmbedder:
  """A retrieval run's towers on your files and texts (module docstring)."""

  def __init__(self, workdir: str | pathlib.Path, step: int | str | None = None):
    import jax  # pylint: disable=g-import-not-at-top
    from avtext import inspect as inspect_lib  # pylint: disable=g-import-not-at-top
    self.run = inspect_lib.load_run(workdir, step)
    self.workdir = pathlib.Path(workdir).absolute()
    self.step = self.run.step
    self.task = self.run.task()
    fns = self.task.predict_fns()
    if "embed_video" not in fns or "embed_text" not in fns:
      raise ValueError(f"{workdir}: a {self.run.config.task!r} run has no embed_video / "
                       "embed_text; avtext.index needs a retrieval run (e.g. "
                       "configs/videocc_avr.py)")
    variables = self.run.variables
    self._video = jax.jit(lambda b: fns["embed_video"](variables, b))
    self._text = jax.jit(lambda b: fns["embed_text"](variables, b))

  def source(self, paths: Sequence[str], names: Sequence[str], where: str
             ) -> files.MediaClips | None:
    data = self.run.config.data
    entries = [files.Entry(str(p), "", n, n) for p, n in zip(paths, names)]
    if not entries:
      return None
    return files.MediaClips(entries, where=where, fps=data.fps, sample_rate=data.sample_rate,
                            short_side=data.image_size, min_seconds=0.5, progress=True,
                            allow_empty=True)

  def embed_videos(self, source: files.MediaClips, *, progress: bool = True
                   ) -> tuple[np.ndarray, dict[int, video_io.VideoReadError]]:
    """(float32 [N, D] means of the K clip embeddings, {index: error} of files that
    failed while decoded; their rows are zeros)."""
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top
    examples = self.task.eval_examples(source)
    failed, rows, out = {}, [], []
    last_good = None
    bar = tqdm(total=len(source), desc="embedding videos", unit="video", disable=not progress,
               file=sys.stdout)
    for start in range(0, len(source), BATCH):
      batch = []
      for i in range(start, min(start + BATCH, len(source))):
        try:
          ex = examples(i)
          last_good = ex
        except video_io.VideoReadError as e:
          failed[i] = e
          ex = None
        batch.append(ex)
        bar.update(1)
      fill = last_good or next((b for b in batch if b is not None), None)
      if fill is None:
        out.append(None)
        rows.append(len(batch))
        continue
      full = [b if b is not None else fill for b in batch]
      full += [fill] * (BATCH - len(full))
      keys = [k for k, v in fill.items() if isinstance(v, np.ndarray) and v.dtype.kind in "biuf"]
      stacked = {k: np.stack([b[k] for b in full]) for k in keys}
      emb = np.asarray(self._video(stacked), np.float32)  # [B, K, D]
      out.append(emb[:len(batch)].mean(axis=1))
      rows.append(len(batch))
    bar.close()
    dim = next((o.shape[1] for o in out if o is not None), 0)
    vectors = np.concatenate([o if o is not None else np.zeros((r, dim), np.float32)
                              for o, r in zip(out, rows)]) if out else np.zeros((0, dim))
    return vectors.astype(np.float32), failed

  def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
    """float32 [N, D]: the run's text embedding of each text, as the evaluator makes it."""
    out = []
    for start in range(0, len(texts), BATCH):
      chunk = list(texts[start:start + BATCH])
      tokens = self.task.tokenizer(chunk + [""] * (BATCH - len(chunk)))
      emb = np.asarray(self._text({k: np.asarray(v) for k, v in tokens.items()}), np.float32)
      out.append(emb[:len(chunk)])
    return np.concatenate(out) if out else np.zeros((0, 0), np.float32)


def list_videos(root: pathlib.Path) -> list[str]:
  """Video files under root, relative, sorted."""
  return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                if p.is_file() and p.suffix.lower() in files.VIDEO_SUFFIXES)


class VideoIndex:
  """INDEX/ on disk (module docstring): `vectors`, `ids`, `meta`."""

  def __init__(self, path: str | pathlib.Path):
    self.path = pathlib.Path(path)
    meta_path = self.path / "meta.json"
    if not meta_path.exists():
      raise FileNotFoundError(f"{self.path}: no meta.json; build it with python -m "
                              "avtext.index --run=DIR --videos=DIR --out=" + str(self.path))
    self.meta = json.loads(meta_path.read_text())
    if self.meta.get("format") != FORMAT:
      raise ValueError(f"{meta_path}: format {self.meta.get('format')!r}, expected {FORMAT!r}")
    self.ids = json.loads((self.path / "ids.json").read_text())
    self.vectors = np.load(self.path / "vectors.npy")

  def search(self, queries: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores [Q, k], rows [Q, k]) by inner product, best first (FAISS, exact)."""
    import faiss  # pylint: disable=g-import-not-at-top
    index = faiss.read_index(str(self.path / "index.faiss"))
    return index.search(np.ascontiguousarray(queries, np.float32), min(top, len(self.ids)))


def build(run: str | pathlib.Path, videos: str | pathlib.Path, out: str | pathlib.Path, *,
          step: int | str | None = None, embedder: VideoEmbedder | None = None,
          progress: bool = True) -> dict:
  """Indexes the new videos of `videos` into `out`; returns the updated meta."""
  import faiss  # pylint: disable=g-import-not-at-top
  root, out = pathlib.Path(videos).expanduser().absolute(), pathlib.Path(out)
  if not root.is_dir():
    raise FileNotFoundError(f"--videos={videos}: no such directory")
  emb = embedder or VideoEmbedder(run, step)
  identity = {"workdir": str(emb.workdir), "step": emb.step,
              "config_sha256": config_hash(emb.workdir)}
  ids, vectors = [], None
  if (out / "meta.json").exists():
    old = VideoIndex(out)
    if old.meta["run"] != identity:
      raise ValueError(f"{out}: built with run {old.meta['run']}, not {identity}; an index "
                       "holds one run's embeddings: use another --out")
    ids, vectors = old.ids, old.vectors
  known = set(ids)
  new = [n for n in list_videos(root) if n not in known]
  source = emb.source([str(root / n) for n in new], new, f"videos under {root}")
  skipped = [{"path": s.clip_id, "reason": s.reason, "detail": s.detail}
             for s in (source.skipped if source is not None else [])]
  added = []
  if source is not None and len(source):
    vecs, failed = emb.embed_videos(source, progress=progress)
    keep = [i for i in range(len(source)) if i not in failed]
    skipped += [{"path": source.entries[i].clip_id, "reason": e.reason, "detail": e.detail}
                for i, e in failed.items()]
    added = [source.entries[i].clip_id for i in keep]
    vecs = vecs[keep]
    vectors = vecs if vectors is None or not len(vectors) else np.concatenate([vectors, vecs])
    ids = ids + added
  out.mkdir(parents=True, exist_ok=True)
  if vectors is None or not len(ids):
    raise ValueError(f"{root}: no video could be indexed ({len(skipped)} skipped: "
                     f"{collections.Counter(s['reason'] for s in skipped)})")
  index = faiss.IndexFlatIP(vectors.shape[1])
  index.add(np.ascontiguousarray(vectors, np.float32))
  faiss.write_index(index, str(out / "index.faiss"))
  np.save(out / "vectors.npy", vectors.astype(np.float32))
  (out / "ids.json").write_text(json.dumps(ids, indent=0))
  meta = {"format": FORMAT, "run": identity, "videos": str(root), "num_videos": len(ids),
          "dim": int(vectors.shape[1]), "num_clips": int(emb.run.config.data.eval_num_clips),
          "last_added": len(added), "skipped": skipped,
          "skip_counts": dict(collections.Counter(s["reason"] for s in skipped))}
  (out / "meta.json").write_text(json.dumps(meta, indent=1))
  return meta


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="python -m avtext.index",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--run", required=True, help="a retrieval run directory")
  parser.add_argument("--step", default=None, help="checkpoint: N, 'best' or latest (default)")
  parser.add_argument("--videos", required=True, help="a folder of videos (recursive)")
  parser.add_argument("--out", required=True, help="the index directory (created or extended)")
  args = parser.parse_args(argv)
  step = int(args.step) if args.step and args.step.isdigit() else args.step
  meta = build(args.run, args.videos, args.out, step=step)
  counts = ", ".join(f"{k} {v}" for k, v in sorted(meta["skip_counts"].items())) or "none"
  print(f"{args.out}: {meta['num_videos']} videos ({meta['last_added']} added); "
        f"skipped: {counts}")
  for s in meta["skipped"]:
    print(f"  skipped {s['path']}: {s['reason']} {s['detail']}")


if __name__ == "__main__":
  main()
