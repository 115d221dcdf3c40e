"""Clips read lazily from the user's media files: the one core of the real-data builders.

`videocc3m`, `msrvtt`, `audiocaps` and `clotho` (and `avtext.index` over a folder of your
own videos) turn their annotation files into a list of `Entry`s (a file, a span in it, a
caption) and hand it to `MediaClips`, a 'clips' source (see `avtext.data.builders`):

  describe(i)                    caption, ids, has_audio, num_frames at `fps` over the part
                                 of the span inside the file, num_samples over the span
  render_frames(i, frame_idx)    decodes only those frames (seek + forward decode,
                                 resized on decode to `short_side`)
  render_audio(i, start, n)      16 kHz mono, zero-padded past the file's end
  __getitem__(i)                 the whole clip (what `avtext.materialize` stores)

Opening a source probes every file once (headers only; `verify="decode"` decodes each
file end to end instead) with a progress bar, and puts each entry whose file is bad out
of the source, counted by reason (`SKIP_REASONS`) and logged:

  missing / empty / unreadable   no file, zero bytes, not a media file FFmpeg can open
  no_video                       no video stream, in a dataset that reads frames
  no_audio                       no audio stream, in an audio dataset (Clotho, AudioCaps)
  truncated                      the streams stop before their declared duration
                                 (seen by verify="decode", or when a read hits it)
  short                          less than `min_seconds` of the entry's span lies inside
                                 the file (a 0.2 s video; a span starting past the end)

A video with no audio stream is *kept* in a video dataset: its audio is zeros and
has_audio is False (VideoCC app. C feeds zeros for MSR-VTT videos without sound). With
`on_bad="raise"` the first bad file raises instead, naming it.

A file that passes the probe and fails when read (cut short after a valid index) is
found only then. In a training split (`substitute=True`) the reader takes the next
entry whose file reads instead, and the skip is counted (`skip_counts`, which the
trainer writes next to its metrics); the choice depends on the files only, so a resumed
run makes the same one. In an evaluation split the error propagates: substituting
would change the ground truth; open it with verify="decode" to find such files first.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import os
import pathlib
import threading
from typing import Any, Iterable, Sequence

from absl import logging
import numpy as np

from avtext import atomic
from avtext.data import builders
from avtext.data import video_io

SKIP_REASONS = video_io.REASONS + ('no_audio', 'short')
VIDEO_SUFFIXES = ('.mp4', '.mkv', '.webm', '.avi', '.mov', '.m4v')
AUDIO_SUFFIXES = ('.wav', '.flac', '.mp3', '.m4a', '.ogg')


@dataclasses.dataclass(frozen=True)
class Entry:
  """One example: `caption` for the span [start_s, end_s) of `path` (end None: the file's
  end). `video_id` groups several captions of one video (the retrieval evaluator's
  ground truth); `clip_id` names the example."""
  path: str
  caption: str
  clip_id: str
  video_id: str | None = None
  start_s: float = 0.0
  end_s: float | None = None


@dataclasses.dataclass(frozen=True)
class Skip:
  clip_id: str
  path: str
  reason: str
  detail: str = ''


def find_media(directory: str | pathlib.Path, stem: str,
               suffixes: Sequence[str] = VIDEO_SUFFIXES) -> pathlib.Path:
  """`directory/stem<suffix>` for the first suffix that exists; the first candidate
  (reported as 'missing' by the probe) when none does."""
  directory = pathlib.Path(directory)
  for suffix in suffixes:
    path = directory / f'{stem}{suffix}'
    if path.exists():
      return path
  return directory / f'{stem}{suffixes[0]}'


def _probe_one(path: str, need: str, verify: str) -> dict:
  """{'info': VideoInfo fields} or {'reason', 'detail'} for one file."""
  try:
    if verify == 'decode':
      info = video_io.verify(path, video=need == 'video', audio=need == 'audio')
    else:
      info = video_io.probe(path, need_video=need == 'video')
  except video_io.VideoReadError as e:
    return {'reason': e.reason, 'detail': e.detail}
  if need == 'audio' and not info.has_audio:
    return {'reason': 'no_audio', 'detail': 'the file has no audio stream'}
  if not np.isfinite(info.duration_s) or info.duration_s <= 0:
    return {'reason': 'unreadable', 'detail': f'no duration in the headers ({info.duration_s})'}
  return {'info': dataclasses.asdict(info)}


def probe_files(paths: Iterable[str], *, need: str = 'video', verify: str = 'probe',
                threads: int = 8, progress: str | None = None,
                cache: str | pathlib.Path | None = None) -> dict[str, dict]:
  """path -> `_probe_one` result for every distinct path, `threads` at a time, with a
  progress bar titled `progress`. `cache`: a JSON file of earlier results, reused for
  files whose size and mtime did not change, and rewritten."""
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  paths = sorted(set(paths))
  key = lambda p: _file_key(p) + f'|{need}|{verify}'
  old = {}
  if cache is not None and pathlib.Path(cache).exists():
    try:
      old = json.loads(pathlib.Path(cache).read_text())
    except ValueError:
      logging.warning('%s: not a probe cache (bad JSON); probing again', cache)
  out, todo = {}, []
  for p in paths:
    hit = old.get(p)
    if hit is not None and hit.get('key') == key(p):
      out[p] = hit['result']
    else:
      todo.append(p)
  with concurrent.futures.ThreadPoolExecutor(max(1, threads)) as pool:
    results = pool.map(lambda p: _probe_one(p, need, verify), todo)
    for p, r in tqdm(zip(todo, results), total=len(todo), desc=progress or 'probing files',
                     disable=not todo or progress is None, leave=False):
      out[p] = r
  if cache is not None and todo:
    atomic.write_json(cache, {p: {'key': key(p), 'result': r} for p, r in out.items()},
                      durable=False)  # a cache: rebuilt when lost
  return out


def _file_key(path: str) -> str:
  try:
    st = os.stat(path)
  except OSError:
    return 'absent'
  return f'{st.st_size}:{st.st_mtime_ns}'


class MediaClips:
  """`Entry`s over media files as a lazy 'clips' source (module docstring).

  Args:
    entries: the examples, in order.
    where: what the source is, for messages ("msrvtt 'test_1ka' under /data/msrvtt").
    need: 'video' (frames, and audio when there is) or 'audio' (audio only: frames are
      not read; num_frames counts the span at `fps` so clip samplers still work).
    fps, sample_rate: frames and audio samples a second (25 and 16 kHz, VideoCC app. C).
    short_side: resize frames on decode to this shorter side (None: as stored).
    min_seconds: entries with less of their span inside the file are skipped ('short').
    on_bad: 'skip' (count and log) or 'raise'.
    verify: 'probe' (headers) or 'decode' (each file end to end; slower, sees truncation).
    substitute: a read that fails takes the next readable entry (training splits).
    probe_cache: a JSON file to keep probe results in between runs (None: none).
    allow_empty: no error when every file is bad (tools that report the skips).
  """
  kind = builders.CLIPS
  AUDIO_CACHE_S = 60.0  # spans up to this long are decoded whole once per clip

  def __init__(self, entries: Sequence[Entry], *, where: str, need: str = 'video',
               fps: float = 25.0, sample_rate: int = 16000, short_side: int | None = None,
               min_seconds: float = 1.0, on_bad: str = 'skip', verify: str = 'probe',
               substitute: bool = False, probe_cache: str | None = None,
               progress: bool = True, allow_empty: bool = False):
    if need not in ('video', 'audio'):
      raise ValueError(f'{where}: need must be "video" or "audio", got {need!r}')
    if on_bad not in ('skip', 'raise'):
      raise ValueError(f'{where}: config.dataset.on_bad must be "skip" or "raise", '
                       f'got {on_bad!r}')
    if verify not in ('probe', 'decode'):
      raise ValueError(f'{where}: config.dataset.verify must be "probe" or "decode", '
                       f'got {verify!r}')
    self.where, self.need = where, need
    self.fps, self.sample_rate = float(fps), int(sample_rate)
    self.short_side = short_side
    self.substitute = substitute
    probes = probe_files((e.path for e in entries), need=need, verify=verify,
                         progress=f'{where}: probing' if progress else None,
                         cache=probe_cache)
    self.skipped: list[Skip] = []
    kept = []
    for e in entries:
      r = probes[e.path]
      reason, detail = r.get('reason'), r.get('detail', '')
      if reason is None:
        dur = r['info']['duration_s']
        inside = min(dur, e.end_s if e.end_s is not None else dur) - e.start_s
        if inside < min_seconds:
          reason, detail = 'short', (f'{max(inside, 0):.2f} s of the span '
                                     f'{e.start_s:.2f}-{e.end_s if e.end_s is not None else dur:.2f} s '
                                     f'inside a {dur:.2f} s file (min_seconds={min_seconds})')
      if reason is None:
        kept.append((e, video_io.VideoInfo(**r['info'])))
      elif on_bad == 'raise':
        raise video_io.VideoReadError(e.path, reason if reason in video_io.REASONS else
                                      'unreadable', f'{reason}: {detail}; {where} '
                                      '(config.dataset.on_bad="skip" counts it instead)')
      else:
        self.skipped.append(Skip(e.clip_id, e.path, reason, detail))
    self._lock = threading.Lock()
    self._bad_paths: dict[str, str] = {}  # path -> reason, found while reading
    self._read_skips = collections.Counter()
    self._audio_cache: dict[tuple, np.ndarray] = {}
    if self.skipped:
      counts = collections.Counter(s.reason for s in self.skipped)
      first = self.skipped[0]
      logging.warning('%s: skipped %d of %d entries (%s); first: %s: %s %s', where,
                      len(self.skipped), len(entries),
                      ', '.join(f'{k} {v}' for k, v in sorted(counts.items())),
                      first.path, first.reason, first.detail)
    if not kept and not allow_empty:
      raise ValueError(f'{where}: none of its {len(entries)} entries has a readable file'
                       + (f' (first: {self.skipped[0].path}: {self.skipped[0].reason})'
                          if self.skipped else ''))
    self.entries = [e for e, _ in kept]
    self.infos = [i for _, i in kept]

  # ---- counts ------------------------------------------------------------

  def skip_counts(self) -> dict[str, int]:
    """{reason: entries skipped}: at open, plus files that failed when read."""
    counts = collections.Counter(s.reason for s in self.skipped)
    with self._lock:
      counts.update(self._read_skips)
    return dict(sorted(counts.items()))

  def __len__(self) -> int:
    return len(self.entries)

  def __repr__(self) -> str:
    return f'MediaClips({self.where}: {len(self)} clips, {len(self.skipped)} skipped)'

  # ---- access ------------------------------------------------------------

  def _get(self, index: int) -> tuple[Entry, video_io.VideoInfo]:
    i = int(index)
    if not 0 <= i < len(self.entries):
      raise IndexError(f'{self!r}: index {index} out of range')
    return self.entries[i], self.infos[i]

  def _span(self, e: Entry, info: video_io.VideoInfo) -> tuple[float, float]:
    """(seconds of the span, seconds of it inside the file)."""
    end = e.end_s if e.end_s is not None else info.duration_s
    return end - e.start_s, min(end, info.duration_s) - e.start_s

  def describe(self, index: int) -> dict[str, Any]:
    e, info = self._get(index)
    span, inside = self._span(e, info)
    return {'caption': e.caption, 'clip_id': e.clip_id, 'video_id': e.video_id,
            'has_audio': info.has_audio, 'start_s': e.start_s, 'path': e.path,
            'num_frames': max(1, int(np.ceil(inside * self.fps - 1e-6))),
            'num_samples': int(round(span * self.sample_rate)), 'attributes': None}

  def frame_size(self, index: int) -> tuple[int, int]:
    _, info = self._get(index)
    return video_io.fit_short_side(info.height, info.width, self.short_side)

  def render_frames(self, index: int, frame_indices) -> np.ndarray:
    e, info = self._get(index)
    if self.need == 'audio' or not info.has_video:
      raise ValueError(f'{self.where}: {e.path} has no frames to read (an audio dataset); '
                       'set config.model.video.modalities="audio"')
    idx = np.asarray(frame_indices, np.int64).reshape(-1)
    times = np.minimum(e.start_s + idx / self.fps, info.duration_s)
    return video_io.read_frames(e.path, times, size=self.frame_size(index))

  def render_audio(self, index: int, start_sample: int = 0,
                   num_samples: int | None = None) -> np.ndarray:
    e, info = self._get(index)
    total = int(round(self._span(e, info)[0] * self.sample_rate))
    n = total - start_sample if num_samples is None else int(num_samples)
    out = np.zeros(max(n, 0), np.float32)
    if not info.has_audio or n <= 0:
      return out
    if total <= self.AUDIO_CACHE_S * self.sample_rate:
      # A clip's spectrogram windows (8 per clip, K clips at eval) read one decode of
      # the span, kept for the last few spans (threads read different clips; the
      # captions of one video share its span).
      key = (e.path, e.start_s, total)
      with self._lock:
        wave = self._audio_cache.get(key)
      if wave is None:
        wave = np.zeros(total, np.float32)
        got = video_io.read_audio(e.path, e.start_s, total / self.sample_rate,
                                  sample_rate=self.sample_rate)
        wave[:min(total, len(got))] = got[:total]
        with self._lock:
          self._audio_cache[key] = wave
          while len(self._audio_cache) > 8:
            self._audio_cache.pop(next(iter(self._audio_cache)))
      part = wave[max(start_sample, 0):max(start_sample, 0) + n]
      out[:len(part)] = part
      return out
    got = video_io.read_audio(e.path, e.start_s + start_sample / self.sample_rate,
                              n / self.sample_rate, sample_rate=self.sample_rate)
    if got is not None:
      out[:min(n, len(got))] = got[:n]
    return out

  def __getitem__(self, index: int) -> dict[str, Any]:
    d = self.describe(index)
    out = {'caption': d['caption'], 'clip_id': d['clip_id'], 'has_audio': d['has_audio']}
    if d['video_id'] is not None:
      out['video_id'] = d['video_id']
    if self.need == 'video':
      out['frames'] = self.render_frames(index, np.arange(d['num_frames']))
    out['audio'] = (self.render_audio(index) if d['has_audio']
                    else np.zeros(0, np.float32))
    return out

  # ---- read failures -----------------------------------------------------

  def replacement(self, index: int, error: video_io.VideoReadError) -> int | None:
    """The entry to read instead of `index`, whose file failed with `error`; None (the
    caller raises) when this source does not substitute (module docstring)."""
    if not self.substitute:
      return None
    e, _ = self._get(index)
    with self._lock:
      if e.path not in self._bad_paths:
        self._bad_paths[e.path] = error.reason
        n = sum(1 for x in self.entries if x.path == e.path)
        self._read_skips[error.reason] += n
        logging.warning('%s: %s failed when read (%s); %d entr%s skipped from now on',
                        self.where, e.path, error, n, 'y' if n == 1 else 'ies')
      bad = dict(self._bad_paths)
    for k in range(1, len(self.entries)):
      j = (int(index) + k) % len(self.entries)
      if self.entries[j].path not in bad:
        return j
    raise ValueError(f'{self.where}: every file failed when read (last: {error})')


def options(dataset, split: str, where: str, *, need: str = 'video',
            train_splits: Sequence[str] = ('train',)) -> dict[str, Any]:
  """MediaClips keyword arguments from `config.dataset` (the fields every file-backed
  builder shares; see the builders' docstrings)."""
  return dict(where=where, need=need, fps=dataset.get('fps', 25.0),
              sample_rate=dataset.get('sample_rate', 16000),
              short_side=dataset.get('short_side'),
              min_seconds=dataset.get('min_seconds', 1.0),
              on_bad=dataset.get('on_bad', 'skip'), verify=dataset.get('verify', 'probe'),
              substitute=split in train_splits, probe_cache=dataset.get('probe_cache'),
              progress=dataset.get('progress', True))


def require_path(dataset, name: str, prepare: str) -> pathlib.Path:
  """config.dataset.path as a directory that exists, or an error saying what to prepare."""
  path = dataset.get('path')
  if not path:
    raise FileNotFoundError(f'config.dataset.path: set it to your {name} directory '
                            f'(dataset {dataset.get("name")!r}). {prepare}')
  root = pathlib.Path(path).expanduser()
  if not root.is_dir():
    raise FileNotFoundError(f'config.dataset.path={path}: no such directory. {prepare}')
  return root


def read_csv_rows(path: pathlib.Path, columns: Sequence[str]) -> list[dict[str, str]]:
  """The rows of a CSV with a header as dicts; an error naming the file when a column
  the layout needs is absent. Row k of the result is line k + 2 of the file."""
  import csv  # pylint: disable=g-import-not-at-top
  with open(path, newline='', encoding='utf-8') as f:
    reader = csv.DictReader(f)
    missing = [c for c in columns if c not in (reader.fieldnames or ())]
    if missing:
      raise ValueError(f'{path}: no column {missing} (header: {reader.fieldnames}); expected '
                       f'{",".join(columns)}')
    return list(reader)


def require_file(path: pathlib.Path, name: str, prepare: str) -> pathlib.Path:
  if not path.is_file():
    raise FileNotFoundError(f'{path}: not found ({name}). {prepare}')
  return path
