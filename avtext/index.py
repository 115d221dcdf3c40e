r"""Index a folder of your own videos with a trained retrieval run, for `avtext.search_videos`.

    python -m avtext.index --workdir=workdirs/demo/avr [--step=best] --videos=~/my_videos \
        --out=~/my_videos.index

Every video under --videos (recursively; `builders.media_clips.VIDEO_SUFFIXES`) is read through
`builders.media_clips.MediaClips` with the run's `config.data` (frames at its fps, decoded at
the model's image size; 16 kHz audio, zeros when a file has none) and embedded exactly as
the retrieval evaluator embeds a test video: `task.eval_examples` takes K =
`data.eval_num_clips` clips spread over the whole video (VideoCC §4.1), batched on the
run's mesh by `evals.base.map_examples` (global batches of `config.eval.batch_size`,
a multiple of the data-parallel devices, the last one padded), and the run's
`embed_video` encodes them. The evaluator scores a caption by averaging its
similarity with the K clips; that average is the inner product of the text embedding
with the mean of the K clip embeddings, which is what the index stores. A progress bar
counts the videos.

INDEX/ holds
  index.faiss    a FAISS inner-product index over the video vectors (exact up to
                 200k videos, then HNSW: `mining.search.build_index`)
  vectors.npy    the vectors, float32 [N, D], row i = ids[i]
  clips.npy      each video's K clip embeddings, float32 [N, K, D] (their mean is its
                 vector): which clip of a hit matches the query best (`clip_ranges`
                 gives their times); indexes written before it was kept lack it
  ids.json       the videos' paths relative to --videos
  stamps.json    each video's [size, mtime_ns] when it was embedded
  meta.json      the run's identity (absolute workdir, step, sha256 of its config.json),
                 the videos directory, and the files skipped (path, reason, detail) with
                 counts by reason
Bad files (missing, empty, unreadable, no video stream, shorter than 0.5 s, truncated)
are skipped, counted by reason and listed, here and in meta.json; a video without
sound is indexed with zeros for audio (has_audio False), as the evaluator feeds it.

Re-running with the same --out brings the index up to date: new files are embedded,
files whose size or modification time changed are embedded again, files gone from the
folder are dropped, and it reports how many were added, updated and removed (skipped
files are tried again). An index holds one run's embeddings of one folder: another
--workdir, --step (a "best" that moved on included) or --videos is an error.
"""
from __future__ import annotations

import collections
import hashlib
import json
import pathlib
from typing import Sequence

from absl import flags
from absl import logging
import numpy as np

from avtext import atomic
from avtext import cli
from avtext import errors
from avtext.data import video_io
from avtext.data.builders import media_clips
from avtext.train import rundir

FORMAT = "avtext.video_index/1"
MIN_SECONDS = 0.5  # shorter files are skipped ('short'): too little for one clip


def config_hash(workdir: str | pathlib.Path) -> str:
  return hashlib.sha256((pathlib.Path(workdir) / "config.json").read_bytes()).hexdigest()


def run_mesh(config, where: str):
  """The run's mesh (`config.num_devices`, as the trainer builds it); all visible devices
  when this machine has fewer than the run was trained on."""
  import jax  # pylint: disable=g-import-not-at-top
  from avtext.train import partitioning  # pylint: disable=g-import-not-at-top
  num_devices = config.get("num_devices")
  if num_devices not in (None, 0, -1) and num_devices > jax.device_count():
    logging.warning("%s: trained on %d devices, %d visible here; using all of them", where,
                    num_devices, jax.device_count())
    num_devices = None
  return partitioning.make_mesh(num_devices, config.get("model_parallel", 1))


def global_batch(config, mesh, n: int) -> int:
  """The evaluator's global batch (`config.eval.batch_size`), no larger than n examples
  need, rounded up to a multiple of the mesh's data-parallel devices."""
  from avtext.train import partitioning  # pylint: disable=g-import-not-at-top
  shards = partitioning.num_data_shards(mesh)
  size = max(1, min(int(config.eval.batch_size), n))
  return -(-size // shards) * shards


def media_source(data, paths: Sequence[str], where: str, *, names: Sequence[str] | None = None,
                 progress: bool = True) -> media_clips.MediaClips:
  """Your files as a MediaClips source read with a run's `config.data` (its fps and sample
  rate, frames decoded at its image size); the bad ones are in its `skipped`."""
  names = paths if names is None else names
  return media_clips.MediaClips([media_clips.Entry(str(p), "", n, n) for p, n in zip(paths, names)],
                                where=where, fps=data.fps, sample_rate=data.sample_rate,
                                short_side=data.image_size, min_seconds=MIN_SECONDS,
                                progress=progress, allow_empty=True)


def clip_ranges(data, duration_s: float) -> list[tuple[float, float]]:
  """[(start s, end s)] of the K = `data.eval_num_clips` clips the index embeds of a video
  lasting `duration_s` (`video.test_clip_indices` over its frames at `data.fps`, as
  `media_source` counts them): row k of clips.npy is clip k."""
  from avtext.data import video  # pylint: disable=g-import-not-at-top
  num_frames = max(1, int(np.ceil(duration_s * data.fps - 1e-6)))
  idx = video.test_clip_indices(num_frames, int(data.num_frames), int(data.frame_stride),
                                num_clips=int(data.eval_num_clips))
  return [(float(c[0] / data.fps), float(min((c[-1] + 1) / data.fps, duration_s)))
          for c in idx]


def map_files(fn, examples, n: int, *, mesh, global_batch_size: int, collate=None,
              progress: str | None = None):
  """`evals.base.map_examples` over the examples of n files, where a file that passed the
  probe may still fail when decoded: its batch row is filled with another file's
  example, and it is reported instead of stopping the others. Returns (fn's outputs
  [n, ...] per leaf, or None when no file could be read; {row: VideoReadError}).
  `progress`: the title of a progress bar counting the files."""
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  from avtext.evals import base  # pylint: disable=g-import-not-at-top
  failed: dict[int, video_io.VideoReadError] = {}
  ahead: dict[int, dict] = {}
  stand_in: list[dict] = []  # the last example read

  def read(i: int) -> dict:
    bar.update(1)
    if i in ahead:
      return ahead.pop(i)
    if i not in failed:
      try:
        stand_in[:] = [examples(i)]
        return stand_in[0]
      except video_io.VideoReadError as e:
        failed[i] = e
    j = i + 1
    while not stand_in and j < n:  # a failure before any success: read ahead for one
      try:
        ahead[j] = examples(j)
        stand_in[:] = [ahead[j]]
      except video_io.VideoReadError as e:
        failed[j] = e
      j += 1
    if not stand_in:
      raise _NothingReadable
    return stand_in[0]

  bar = tqdm(total=n, desc=progress, unit="file", disable=progress is None)
  try:
    out, _ = base.map_examples(fn, read, n, mesh=mesh, global_batch_size=global_batch_size,
                               collate=collate)
  except _NothingReadable:
    return None, failed
  finally:
    bar.close()
  return out, failed


class _NothingReadable(Exception):
  """Every file failed when decoded."""


class VideoEmbedder:
  """A retrieval run's towers, on its mesh, over your files and texts (module docstring)."""

  def __init__(self, workdir: str | pathlib.Path, step: int | str | None = None):
    import jax  # pylint: disable=g-import-not-at-top
    from avtext.inference import exported  # pylint: disable=g-import-not-at-top
    from avtext import runs as runs_lib  # pylint: disable=g-import-not-at-top
    from avtext.train import partitioning  # pylint: disable=g-import-not-at-top
    self.run = runs_lib.load_run(workdir, step)
    self.workdir, self.step = self.run.workdir, self.run.step
    self.task = self.run.task()
    fns = self.task.predict_fns()
    if "embed_video" not in fns or "embed_text" not in fns:
      raise errors.BadInput(f"{workdir}: a {self.run.config.task!r} run has no embed_video"
                            " / embed_text; avtext.index needs a retrieval run (e.g. "
                            "configs/videocc_avr.py)")
    self.mesh = run_mesh(self.run.config, str(workdir))
    self.variables = jax.device_put(self.run.variables, partitioning.replicated(self.mesh))
    # Traced and lowered once per model config and shapes, then kept on disk.
    identity, single = config_hash(self.workdir), self.mesh.devices.size == 1
    self._video = exported.CachedJit(fns["embed_video"], "embed_video", identity,
                                     enabled=single)
    self._text = exported.CachedJit(fns["embed_text"], "embed_text", identity, enabled=single)

  @property
  def identity(self) -> dict:
    return {"workdir": str(self.workdir), "step": self.step,
            "config_sha256": config_hash(self.workdir)}

  def source(self, paths: Sequence[str], names: Sequence[str], where: str, *,
             progress: bool = True) -> media_clips.MediaClips:
    return media_source(self.run.config.data, paths, where, names=names, progress=progress)

  def embed_clips(self, source: media_clips.MediaClips, *, progress: bool = True
                  ) -> tuple[np.ndarray, dict[int, video_io.VideoReadError]]:
    """(float32 [N, K, D]: the embeddings of each video's K clips, {row: error} for the
    files that passed the probe but failed when decoded; their rows are zeros)."""
    n = len(source)
    out, failed = map_files(lambda b: self._video(self.variables, b),
                            self.task.eval_examples(source), n, mesh=self.mesh,
                            global_batch_size=global_batch(self.run.config, self.mesh, n),
                            collate=getattr(self.task, "collate", None),
                            progress="embedding videos" if progress else None)
    if out is None:
      return np.zeros((n, 1, 0), np.float32), failed
    clips = np.array(out, np.float32)
    clips[sorted(failed)] = 0.0
    return clips, failed

  def embed_videos(self, source: media_clips.MediaClips, *, progress: bool = True
                   ) -> tuple[np.ndarray, dict[int, video_io.VideoReadError]]:
    """(float32 [N, D]: each video's mean of its K clip embeddings, {row: error} for the
    files that passed the probe but failed when decoded; their rows are zeros)."""
    clips, failed = self.embed_clips(source, progress=progress)
    return clips.mean(axis=1), failed

  def note_cut_texts(self, texts: Sequence[str], what: str = "query") -> None:
    """`cli.note_cut` for each text longer than the run's tokenizer keeps."""
    tokenizer = self.task.tokenizer
    if not hasattr(tokenizer, "wordpiece"):
      return
    for i, text in enumerate(texts, 1):
      tokens = len(tokenizer.wordpiece(text)) + 2  # + [CLS], [SEP]
      if tokens > tokenizer.max_len:
        cli.note_cut(f"{what} {i} ({len(text)} characters)", tokens, tokenizer.max_len,
                     "the run's text tower reads at most that many")

  def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
    """float32 [N, D]: each text tokenized and embedded as the evaluator does a caption."""
    from avtext.evals import base  # pylint: disable=g-import-not-at-top
    if not texts:
      raise ValueError("no texts to embed")
    tokens = self.task.tokenizer(list(texts))
    n = len(texts)
    out, _ = base.map_examples(lambda b: self._text(self.variables, b),
                               lambda i: {k: np.asarray(v[i]) for k, v in tokens.items()},
                               n, mesh=self.mesh,
                               global_batch_size=global_batch(self.run.config, self.mesh, n))
    return np.asarray(out, np.float32)


def list_videos(root: pathlib.Path) -> list[str]:
  """Video files under root, relative, sorted."""
  return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                if p.is_file() and p.suffix.lower() in media_clips.VIDEO_SUFFIXES)


class VideoIndex:
  """INDEX/ on disk (module docstring): `vectors`, `ids`, `meta`, `search`. Every file is
  read when it opens (index.faiss too, so a search fails before the run loads): one that
  does not read is one errors.BadInput saying to delete the index and index again."""

  def __init__(self, path: str | pathlib.Path):
    self.path = pathlib.Path(path)
    meta_path = self.path / "meta.json"
    if not meta_path.exists():
      raise errors.InputNotFound(
          f"{self.path}: not an avtext index (no meta.json); build it with python -m "
          f"avtext.index --workdir=RUN --videos=DIR --out={self.path}")
    self.meta = self._read("meta.json", lambda p: json.loads(p.read_text()))
    if not isinstance(self.meta, dict) or self.meta.get("format") != FORMAT:
      what = self.meta.get("format") if isinstance(self.meta, dict) else None
      raise errors.BadInput(f"{meta_path}: format {what!r}, expected {FORMAT!r}")
    self.ids = self._read("ids.json", lambda p: json.loads(p.read_text()))
    self.vectors = self._read("vectors.npy", lambda p: np.load(p, allow_pickle=False))
    stamps = self.path / "stamps.json"  # absent in indexes written before it was kept
    self.stamps = (self._read("stamps.json", lambda p: json.loads(p.read_text()))
                   if stamps.exists() else [None] * len(self.ids))
    if self.vectors.ndim != 2 or len(self.vectors) != len(self.ids):
      self._corrupt(f"vectors.npy holds {len(self.vectors)} vectors for {len(self.ids)} ids")
    clips = self.path / "clips.npy"  # absent in indexes written before it was kept
    self.clips = (self._read("clips.npy", lambda p: np.load(p, mmap_mode="r",
                                                            allow_pickle=False))
                  if clips.exists() else None)
    self._faiss = self._read("index.faiss", _read_faiss)
    if self._faiss.ntotal != len(self.ids):
      self._corrupt(f"index.faiss holds {self._faiss.ntotal} vectors for {len(self.ids)} ids")

  def _read(self, name: str, read):
    """read(INDEX/name), or `_corrupt` naming the file and why it does not read."""
    try:
      return read(self.path / name)
    except FileNotFoundError:
      self._corrupt(f"{name}: missing")
    except (OSError, ValueError, EOFError, RuntimeError) as e:
      why = ("not UTF-8 text" if isinstance(e, UnicodeDecodeError) else
             "not JSON" if isinstance(e, json.JSONDecodeError) else
             "not a FAISS index" if isinstance(e, RuntimeError) else
             "not a numpy array file" if name.endswith(".npy") else cli.exception_message(e))
      self._corrupt(f"{name}: {why}")

  def _corrupt(self, what: str):
    raise errors.BadInput(f"{self.path}: a corrupt index ({what}); delete it and index "
                          "again (python -m avtext.index --workdir=RUN --videos=DIR "
                          f"--out={self.path})")

  def search(self, queries: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores [Q, k], rows [Q, k]) by inner product, best first."""
    return self._faiss.search(np.ascontiguousarray(queries, np.float32),
                              min(top, len(self.ids)))


def _read_faiss(path: pathlib.Path):
  import faiss  # pylint: disable=g-import-not-at-top
  if not path.is_file():
    raise FileNotFoundError(path)
  return faiss.read_index(str(path))


def stamp(path: pathlib.Path) -> list[int]:
  """[size in bytes, mtime in ns]: a file whose stamp changed is embedded again."""
  st = path.stat()
  return [int(st.st_size), int(st.st_mtime_ns)]


def build(run: str | pathlib.Path, videos: str | pathlib.Path, out: str | pathlib.Path, *,
          step: int | str | None = None, embedder: VideoEmbedder | None = None,
          progress: bool = True) -> dict:
  """Brings `out` up to date with `videos` (module docstring): embeds the new files and
  the changed ones (size or mtime differ), drops the rows of the files gone; returns
  meta.json, whose last_added / last_updated / last_removed count what changed. --videos
  and --out are checked first; one process writes `out` at a time (`rundir.output_lock`)."""
  cli.check_input_dir("videos", str(videos), "folder of videos")
  cli.check_output_dir("out", str(out))
  with rundir.output_lock(pathlib.Path(out).expanduser(), "out"):
    return _build(run, videos, out, step=step, embedder=embedder, progress=progress)


def _build(run, videos, out, *, step, embedder, progress) -> dict:
  root, out = pathlib.Path(videos).expanduser().absolute(), pathlib.Path(out).expanduser()
  old = VideoIndex(out) if (out / "meta.json").exists() else None
  if old is not None and old.meta["videos"] != str(root):
    raise errors.BadInput(f"{out}: an index of the videos under {old.meta['videos']}, not "
                          f"{root}; use another --out")
  emb = embedder or VideoEmbedder(run, step)
  ids, clips, stamps = [], None, []
  if old is not None:
    if old.meta["run"] != emb.identity:
      raise errors.BadInput(f"{out}: built with run {old.meta['run']}, not {emb.identity}; "
                            "an index holds one run's embeddings: use another --out")
    if old.clips is None:  # written before clips.npy was kept: embed every video again
      old.ids, old.stamps = [], []
    ids, clips, stamps = old.ids, old.clips, old.stamps
  current = {name: stamp(root / name) for name in list_videos(root)}
  removed = [name for name in ids if name not in current]
  updated = [name for name, st in zip(ids, stamps) if name in current and current[name] != st]
  keep = [i for i, (name, st) in enumerate(zip(ids, stamps)) if current.get(name) == st]
  ids, stamps = [ids[i] for i in keep], [stamps[i] for i in keep]
  clips = np.asarray(clips[keep]) if clips is not None and keep else None
  known = set(ids)
  todo = [name for name in current if name not in known]  # new and updated, sorted
  source = emb.source([str(root / name) for name in todo], todo, f"videos under {root}",
                      progress=progress)
  skipped = [{"path": s.clip_id, "reason": s.reason, "detail": s.detail}
             for s in source.skipped]
  embedded = []
  if len(source):
    vecs, failed = emb.embed_clips(source, progress=progress)
    skipped += [{"path": source.entries[i].clip_id, "reason": e.reason, "detail": e.detail}
                for i, e in sorted(failed.items())]
    good = [i for i in range(len(source)) if i not in failed]
    embedded = [source.entries[i].clip_id for i in good]
    if embedded:
      clips = vecs[good] if clips is None else np.concatenate([clips, vecs[good]])
      ids = ids + embedded
      stamps = stamps + [current[name] for name in embedded]
  counts = dict(sorted(collections.Counter(s["reason"] for s in skipped).items()))
  if not ids:
    raise errors.BadInput(f"{root}: no video could be indexed ({len(skipped)} files skipped: "
                          f"{counts or 'no video files'})")
  updated_set = set(updated)
  meta = {"format": FORMAT, "run": emb.identity, "videos": str(root),
          "num_clips": int(emb.run.config.data.eval_num_clips),
          "last_added": sum(name not in updated_set for name in embedded),
          "last_updated": sum(name in updated_set for name in embedded),
          "last_removed": len(removed) + len(updated_set - set(embedded)),
          "skipped": skipped, "skip_counts": counts}
  return write(out, ids, clips, stamps, meta)


def write(out: pathlib.Path, ids: Sequence[str], clips: np.ndarray, stamps: Sequence,
          meta: dict) -> dict:
  """Writes INDEX/ (module docstring) for videos `ids` with their clip embeddings
  float32 [N, K, D] (each vector is the mean of its K) and `meta` (completed with
  num_videos, dim and the FAISS kind); meta.json last, so its presence marks the index
  whole. Returns meta.json's contents."""
  import faiss  # pylint: disable=g-import-not-at-top
  from avtext.mining import search as mining_search  # pylint: disable=g-import-not-at-top
  clips = np.asarray(clips, np.float32)
  vectors = clips.mean(axis=1)
  out.mkdir(parents=True, exist_ok=True)
  index, kind = mining_search.build_index(vectors, mining_search.IndexConfig())
  (out / "meta.json").unlink(missing_ok=True)
  atomic.replace_with(out / "index.faiss", lambda tmp: faiss.write_index(index, str(tmp)))
  atomic.replace_with(out / "vectors.npy", lambda tmp: np.save(tmp, vectors))
  atomic.replace_with(out / "clips.npy", lambda tmp: np.save(tmp, clips))
  atomic.write_text(out / "ids.json", json.dumps(list(ids), indent=0))
  atomic.write_text(out / "stamps.json", json.dumps(list(stamps)))
  meta = {**meta, "num_videos": len(ids), "dim": int(vectors.shape[1]), "faiss": kind}
  atomic.write_text(out / "meta.json", json.dumps(meta, indent=1))
  return meta


FLAGS = flags.FlagValues()
_WORKDIR = cli.DEFINE_path("workdir", None, "the retrieval run to embed with (e.g. "
                           "workdirs/demo/avr)", flag_values=FLAGS)
_STEP = cli.DEFINE_checkpoint_step(FLAGS)
_VIDEOS = cli.DEFINE_path("videos", None, "a folder of videos, searched recursively",
                          flag_values=FLAGS)
_OUT = cli.DEFINE_path("out", None, "the index directory: created, or brought up to date",
                       flag_values=FLAGS)
flags.mark_flags_as_required(["workdir", "videos", "out"], flag_values=FLAGS)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise errors.BadInput(f"unexpected arguments {list(argv[1:])}; see --help")
  meta = build(_WORKDIR.value, _VIDEOS.value, _OUT.value, step=cli.parse_step(_STEP.value))
  counts = ", ".join(f"{k} {v}" for k, v in meta["skip_counts"].items()) or "none"
  for s in meta["skipped"]:
    print(f"  skipped {s['path']}: {s['reason']} ({s['detail']})")
  print(f"{_OUT.value}: {meta['num_videos']} videos ({meta['last_added']} added, "
        f"{meta['last_updated']} updated, {meta['last_removed']} removed) with "
        f"{meta['run']['workdir']} step {meta['run']['step']}; skipped: {counts}; search it "
        f"with python -m avtext.search_videos --index={_OUT.value}")


if __name__ == "__main__":
  cli.run(main, FLAGS)
