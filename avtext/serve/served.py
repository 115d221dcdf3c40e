"""What `avtext.serve` serves, loaded once: indexes, the runs behind them, a moment corpus.

Every answer goes through the command-line programs' library code: text -> video through
`search_videos.IndexSearcher` (the index's run, one `index.VideoEmbedder` shared by
every index of that run), moments through `search_moments.Searcher`, captions through
`caption.Captioner`. A mistake in a request is `RequestError` (an HTTP status and one
line); the app turns it into a 4xx with that line.

Files: a video is named by its collection (an index's name, or `MOMENTS`) and its id
there (a path relative to the indexed folder, exactly as ids.json lists it; a moment
video's `vid_name`). Only those files are opened: an id a collection does not list is a
404, a path with `..`, an absolute path or a backslash a 400, and a listed file that
resolves outside its folder (a symbolic link) a 403.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import threading
import time
from typing import Sequence

from avtext import cli
from avtext import errors
from avtext import index as index_lib
from avtext.data import video_io
from avtext.data.builders import media_clips

MOMENTS = "moments"  # the collection of the moment videos (--moment_videos)
PLAYABLE = (".mp4", ".m4v", ".webm")  # containers a browser's <video> plays; others as frames


class RequestError(Exception):
  """A bad request: HTTP `status` and a one-line `message` for the page."""

  def __init__(self, status: int, message: str):
    super().__init__(message)
    self.status, self.message = status, message


def check_id(video: str) -> None:
  """400 for a video id that is a path out of its folder: absolute, with `..`, a
  backslash or a NUL (whatever the encoding it came in: the router has decoded it)."""
  if not video or not video.strip():
    raise RequestError(400, "no video given; pick one of the index's videos")
  if "\x00" in video or "\\" in video:
    raise RequestError(400, f"{video!r}: not a video id (a path with a backslash or NUL)")
  if video.startswith("/") or pathlib.PurePosixPath(video).is_absolute() or (
      len(video) > 1 and video[1] == ":"):
    raise RequestError(400, f"{video}: an absolute path; give a video id of the index "
                       "(its path under the indexed folder)")
  if ".." in pathlib.PurePosixPath(video).parts:
    raise RequestError(400, f"{video}: a path with '..'; only the index's own videos are "
                       "served")


@dataclasses.dataclass
class Collection:
  """Videos under `root`, by id: {id: path relative to root}."""
  name: str
  root: pathlib.Path
  files: dict[str, str]
  what: str  # for messages: "the index my_videos.index"

  def path(self, video: str) -> pathlib.Path:
    """The file of `video`, checked: listed, inside the root, still there."""
    check_id(video)
    if video not in self.files:
      raise RequestError(404, f"{video}: no such video in {self.what}")
    path = self.root / self.files[video]
    if not os.path.realpath(path).startswith(os.path.realpath(self.root) + os.sep):
      raise RequestError(403, f"{video}: resolves outside {self.root}; not served")
    if not path.is_file():
      raise RequestError(410, f"{video}: deleted from {self.root} after indexing; index "
                         "the folder again (python -m avtext.index) to drop it")
    return path


@dataclasses.dataclass
class Index:
  """One --index: its name in URLs, directory, and its searcher or why it cannot be
  searched with the served run."""
  name: str
  path: pathlib.Path
  collection: Collection | None
  searcher: object | None  # search_videos.IndexSearcher
  error: str = ""


def moment_collection(folder) -> Collection:
  """The videos under `folder` by stem: a corpus' vid_name is the file's name without
  its suffix (`--moment_videos`)."""
  root = pathlib.Path(folder)
  by_stem = {pathlib.PurePosixPath(f).stem: f for f in index_lib.list_videos(root)}
  return Collection(MOMENTS, root, by_stem, f"the moment videos' folder {root}")


def _names(paths: Sequence[pathlib.Path]) -> list[str]:
  """A short, unique URL name per path: its folder name, numbered when repeated."""
  out, seen = [], {}
  for p in paths:
    base = p.name or "index"
    seen[base] = seen.get(base, 0) + 1
    out.append(base if seen[base] == 1 else f"{base}-{seen[base]}")
  return out


class Served:
  """The indexes (+ their run, `workdir` / `step` or the first index's), the captioning
  run and the moment corpus (+ its XML run and the folder of its videos), each loaded
  once; any may be absent, not all."""

  def __init__(self, *, indexes: Sequence[str] = (), workdir: str | None = None,
               step=None, caption_workdir: str | None = None, caption_step=None,
               moments_workdir: str | None = None, moments_step=None,
               corpus: str | None = None, moment_videos: str | None = None,
               max_upload_mb: float = 64.0):
    from avtext import search_videos  # pylint: disable=g-import-not-at-top
    if not (indexes or caption_workdir or corpus):
      raise errors.BadInput("nothing to serve: give --index=INDEX (search), "
                            "--caption_workdir=RUN (captions) and/or --corpus=DIR with "
                            "--moments_workdir=RUN (moments)")
    if bool(corpus) != bool(moments_workdir) or (moment_videos and not corpus):
      raise errors.BadInput("moments need --corpus=DIR and --moments_workdir=RUN (the XML run "
                            "that encoded it) together; --moment_videos goes with them")
    self.max_upload_mb = max_upload_mb
    self.max_upload_bytes = int(max_upload_mb * (1 << 20))
    self.lock = threading.Lock()  # one model call at a time: the CPU is shared anyway
    self.indexes: dict[str, Index] = {}
    self.runs: dict[str, pathlib.Path] = {}  # run page name -> workdir
    self.embedder = None
    paths = [pathlib.Path(p) for p in indexes]
    for p in paths:
      cli.check_input_dir("index", str(p), "avtext.index directory")
    if paths:
      first = index_lib.VideoIndex(paths[0])
      run = first.meta["run"]
      self.embedder = index_lib.VideoEmbedder(workdir or run["workdir"],
                                              step if workdir else run["step"])
      self.runs["search"] = self.embedder.workdir
    for name, p in zip(_names(paths), paths):
      try:
        searcher = search_videos.IndexSearcher(p, embedder=self.embedder)
      except cli.USER_ERRORS as e:
        self.indexes[name] = Index(name, p, None, None, cli.exception_message(e))
        continue
      meta, ids = searcher.index.meta, searcher.index.ids
      self.indexes[name] = Index(name, p, Collection(name, pathlib.Path(meta["videos"]),
                                                     {i: i for i in ids},
                                                     f"the index {name}"), searcher)
    self.captioner = None
    if caption_workdir:
      from avtext import caption  # pylint: disable=g-import-not-at-top
      self.captioner = caption.Captioner(caption_workdir, caption_step)
      self.runs["caption"] = self.captioner.run.workdir
    self.moments = self.moment_videos = None
    if corpus:
      from avtext import search_moments  # pylint: disable=g-import-not-at-top
      cli.check_input_dir("corpus", corpus, "corpus store")
      self.moments = search_moments.Searcher(moments_workdir, corpus, step=moments_step)
      self.runs["moments"] = self.moments.run.workdir
      if moment_videos:
        cli.check_input_dir("moment_videos", moment_videos, "folder of the corpus' videos")
        self.moment_videos = moment_collection(moment_videos)

  # ------------------------------------------------------------------ lookups

  def index(self, name: str | None) -> Index:
    if not self.indexes:
      raise RequestError(404, "no index is served; start avtext.serve with --index=INDEX")
    index = self.indexes.get(name or next(iter(self.indexes)))
    if index is None:
      raise RequestError(404, f"{name}: no such index; served: {', '.join(self.indexes)}")
    if index.searcher is None:
      raise RequestError(409, index.error)
    return index

  def collection(self, name: str) -> Collection:
    if name == MOMENTS and self.moment_videos is not None:
      return self.moment_videos
    if name in self.indexes and self.indexes[name].collection is not None:
      return self.indexes[name].collection
    raise RequestError(404, f"{name}: no such collection of videos")

  def video(self, collection: str, video: str) -> dict:
    """What the page needs to show a video: its duration, how it plays ('video' through
    /media, or 'frames' for containers a browser does not play) and the clip ranges."""
    path = self.collection(collection).path(video)
    try:
      info = video_io.probe(path)
    except (video_io.VideoReadError, OSError) as e:
      raise RequestError(422, f"{video}: cannot be read ({cli.exception_message(e)})") from None
    kind = "video" if path.suffix.lower() in PLAYABLE else "frames"
    return {"collection": collection, "video": video, "duration": info.duration_s,
            "kind": kind, "width": info.width, "height": info.height}

  def frame(self, collection: str, video: str, t: float, height: int = 96) -> bytes:
    """A JPEG of the frame shown at `t` seconds, `height` pixels high."""
    import io  # pylint: disable=g-import-not-at-top
    from PIL import Image  # pylint: disable=g-import-not-at-top
    path = self.collection(collection).path(video)
    if not 16 <= height <= 720:
      raise RequestError(400, f"height {height}: give 16 to 720 pixels")
    try:
      info = video_io.probe(path)
      h, w = video_io.fit_short_side(info.height, info.width, height)
      t = min(max(0.0, t), max(0.0, info.duration_s - 1e-3))
      image = video_io.read_frames(path, [t], size=(h, w))[0]
    except (video_io.VideoReadError, OSError, ValueError) as e:
      raise RequestError(422, f"{video}: no frame at {t:.2f} s "
                         f"({cli.exception_message(e)})") from None
    out = io.BytesIO()
    Image.fromarray(image).save(out, format="JPEG", quality=85)
    return out.getvalue()

  # ------------------------------------------------------------------ answers

  def search(self, query: str, index: str | None = None, top: int = 5) -> dict:
    """Text -> video: the top videos with score, and each one's best clip (its time
    range; the video's K clips' times and scores) when the index keeps clip vectors."""
    query = (query or "").strip()
    if not query:
      raise RequestError(400, "empty query; type what to look for")
    entry = self.index(index)
    start = time.perf_counter()
    with self.lock:
      found = entry.searcher.hits([query], top=max(1, min(int(top), 50)))[0]
    seconds = time.perf_counter() - start
    data = self.embedder.run.config.data
    hits = []
    for hit in found:
      item = {"video": hit.video, "score": hit.score, "clip_scores": hit.clip_scores}
      try:
        shown = self.video(entry.name, hit.video)
      except RequestError as e:
        hits.append({**item, "error": e.message})
        continue
      ranges = index_lib.clip_ranges(data, shown["duration"])
      best = (max(range(len(hit.clip_scores)), key=hit.clip_scores.__getitem__)
              if hit.clip_scores else None)
      start_s, end_s = ranges[best] if best is not None else (0.0, shown["duration"])
      hits.append({**item, **shown, "clips": ranges, "best_clip": best, "start": start_s,
                   "end": end_s})
    return {"query": query, "index": entry.name, "seconds": seconds, "hits": hits}

  def search_moments(self, query: str, top: int = 10) -> dict:
    """Text -> moments of the stored corpus, each with its span and its video's length."""
    query = (query or "").strip()
    if not query:
      raise RequestError(400, "empty query; type what to look for")
    if self.moments is None:
      raise RequestError(404, "no moment corpus is served; start avtext.serve with "
                         "--corpus=DIR --moments_workdir=RUN")
    start = time.perf_counter()
    with self.lock:
      found = self.moments([query], top=max(1, min(int(top), 50)))[0]
    seconds = time.perf_counter() - start
    store = self.moments.store
    index_of = {v: i for i, v in enumerate(store.videos)}
    out = []
    for vid, st, ed, score in found:
      clips = int(store.mask[index_of[vid]].sum()) if vid in index_of else 0
      item = {"video": vid, "start": float(st), "end": float(ed), "score": float(score),
              "duration": max(float(ed), clips * store.clip_length)}
      if self.moment_videos is None:
        item["error"] = (f"{vid}: no video file to play (start avtext.serve with "
                         "--moment_videos=DIR)")
      else:
        try:
          shown = self.video(MOMENTS, vid)
          item.update(collection=MOMENTS, kind=shown["kind"])
        except RequestError as e:
          item["error"] = (f"{vid}: no file {vid}.<ext> in {self.moment_videos.root}"
                           if e.status == 404 else e.message)
      out.append(item)
    return {"query": query, "seconds": seconds, "moments": out}

  def caption(self, path: pathlib.Path, name: str, beam: int | None) -> dict:
    """The caption of one file, with the seconds it took; a file that cannot be
    captioned is a 422 with its reason."""
    if self.captioner is None:
      raise RequestError(404, "no captioning run is served; start avtext.serve with "
                         "--caption_workdir=RUN")
    if beam is not None and not 1 <= beam <= 16:
      raise RequestError(400, f"beam {beam}: give 1 (greedy) to 16")
    start = time.perf_counter()
    with self.lock:
      [(_, text, why)] = self.captioner([str(path)], beam=beam)
    seconds = time.perf_counter() - start
    if text is None:
      raise RequestError(422, f"{name}: cannot be captioned ({why})")
    return {"video": name, "caption": text, "seconds": seconds,
            "beam": beam or self.captioner.default_beam}

  def caption_video(self, collection: str, video: str, beam: int | None) -> dict:
    return self.caption(self.collection(collection).path(video), video, beam)

  def caption_upload(self, data: bytes, filename: str, beam: int | None) -> dict:
    """Captions uploaded bytes (at most `max_upload_bytes`; the app stops reading there),
    written to a temporary file that is removed afterwards."""
    import tempfile  # pylint: disable=g-import-not-at-top
    suffix = pathlib.PurePosixPath(filename or "upload").suffix.lower()
    if suffix not in media_clips.VIDEO_SUFFIXES:
      raise RequestError(415, f"{filename or 'the upload'}: not a video file (give one of "
                         f"{', '.join(media_clips.VIDEO_SUFFIXES)})")
    if not data:
      raise RequestError(400, f"{filename}: empty upload")
    with tempfile.TemporaryDirectory(prefix="avtext-upload-") as tmp:
      path = pathlib.Path(tmp) / f"upload{suffix}"
      path.write_bytes(data)
      try:
        return self.caption(path, filename, beam)
      except RequestError as e:
        if e.status == 422:
          raise RequestError(415, f"{filename}: not a video that can be read "
                             f"({e.message.split('(', 1)[-1].rstrip(')')})") from None
        raise

  # ------------------------------------------------------------------ runs

  def run_view(self, name: str | None) -> dict:
    """The run page's data: curves (`runs.scalar_curves`), results.json, config.json."""
    from avtext import runs as runs_lib  # pylint: disable=g-import-not-at-top
    if not self.runs:
      raise RequestError(404, "no run is served")
    name = name or next(iter(self.runs))
    if name not in self.runs:
      raise RequestError(404, f"{name}: no such run; served: {', '.join(self.runs)}")
    workdir = self.runs[name]
    results_file = workdir / "results.json"
    try:
      results = json.loads(results_file.read_text()) if results_file.exists() else {}
    except ValueError:
      results = {"error": f"{results_file}: not valid JSON"}
    return {"name": name, "workdir": str(workdir), "curves": runs_lib.scalar_curves(workdir),
            "results": results, "config": (workdir / "config.json").read_text()}
