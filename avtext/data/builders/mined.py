"""`videocc_mined`: the clips a run of the mining pipeline (`python -m avtext.mine`) found.

    --config.dataset.name=videocc_mined --config.dataset.path=<the mining --out directory>

Reads <path>/dataset.json (format avtext.videocc_mined/1: the CSV's name, τ, the clip
length, the video id -> file map, the matched videos without audio, and, when a world
wrote the corpus, that world's meta, 'origin') and <path>/videocc.csv (VideoCC's layout: video id, start µs,
end µs, caption; one line per (clip, caption) pair). Only a 'train' split: mined pairs
are training data; evaluate on another dataset through `config.evals.<name>.dataset`.

A 'clips' source (see `avtext.data.builders`): clip i is line i, `dataset.fps` (25,
VideoCC app. C) frames a second over [start, end), 16 kHz mono audio
(`dataset.sample_rate`), has_audio False for a video without an audio stream. Frames
and audio are read lazily (`describe` / `render_frames` / `render_audio`):

  dataset.decode = "files"   (default) decode the video files with PyAV
                             (`avtext.data.video_io`)
                   "render"  render the corpus from the world that wrote its files (only
                             for a corpus with an origin: its `ground_truth.CorpusTruth`);
                             the same pixels and samples minus the codec's loss, at a
                             fraction of the cost (tests compare the two)
                   "auto"    render when a world wrote the corpus, else decode

Optional: dataset.num_train keeps the first N lines.
"""
from __future__ import annotations

import json
import pathlib
from typing import Any

import ml_collections
import numpy as np

from avtext import errors
from avtext.data import builders
from avtext.data import ground_truth
from avtext.data.builders import videocc3m

FORMAT = 'avtext.videocc_mined/1'


class MinedClips:
  """The mined (clip, caption) pairs as a lazy 'clips' source (module docstring)."""
  kind = builders.CLIPS

  def __init__(self, path: str | pathlib.Path, *, decode: str = 'files', fps: float = 25.0,
               sample_rate: int = 16000, num_examples: int | None = None):
    root = pathlib.Path(path)
    meta_path = root / 'dataset.json'
    if not meta_path.exists():
      raise FileNotFoundError(
          f'config.dataset.path={path}: no dataset.json; point it at the --out directory of '
          '`python -m avtext.mine` (make demo-mining writes workdirs/demo/mining/mined)')
    meta = json.loads(meta_path.read_text())
    if meta.get('format') != FORMAT:
      raise ValueError(f'{meta_path}: format {meta.get("format")!r}, expected {FORMAT!r}')
    if decode not in ('auto', 'files', 'render'):
      raise ValueError(f'config.dataset.decode must be auto, files or render, got {decode!r}')
    if decode == 'render' and not meta.get('origin'):
      raise ValueError(f'{meta_path}: dataset.decode="render" needs a corpus a world wrote; '
                       'this one has no origin, use "files"')
    self.meta, self.fps, self.sample_rate = meta, float(fps), int(sample_rate)
    self.clip_seconds = float(meta['clip_seconds'])
    self.videos: dict[str, str] = meta['videos']
    self.no_audio = set(meta.get('no_audio', ()))
    csv_path = root / meta['csv']
    rows = videocc3m.read_csv(csv_path)
    for n, (vid, *_rest) in enumerate(rows, 1):
      if vid not in self.videos:
        raise ValueError(f'{csv_path}: row {n}: video {vid!r} is not in {meta_path} "videos"')
    if num_examples is not None:
      rows = rows[:num_examples]
    if not rows:
      raise ValueError(f'{csv_path}: no clips (did the mining find no match at τ = '
                       f'{meta.get("tau")}?)')
    self.rows = rows
    self.render = meta.get('origin') is not None and decode in ('auto', 'render')
    self._world = None
    if self.render:
      self._world = ground_truth.open_world(meta['origin'], where=f'{meta_path}: origin',
                                            kind=ground_truth.CorpusTruth)
      if self._world.fps != self.fps or self._world.sample_rate != self.sample_rate:
        raise ValueError(f'{meta_path}: the corpus\' world renders {self._world.fps} fps / '
                         f'{self._world.sample_rate} Hz; set dataset.fps / '
                         'dataset.sample_rate to match or decode="files"')

  def __len__(self) -> int:
    return len(self.rows)

  def __repr__(self) -> str:
    return f'MinedClips({len(self)} clips, {"render" if self.render else "files"})'

  def _row(self, index: int):
    i = int(index)
    if not 0 <= i < len(self.rows):
      raise IndexError(f'{self!r}: index {index} out of range')
    return self.rows[i]

  @property
  def num_frames(self) -> int:
    return int(round(self.clip_seconds * self.fps))

  def describe(self, index: int) -> dict[str, Any]:
    vid, start, end, caption = self._row(index)
    return {'caption': caption, 'clip_id': f'{vid}@{start}-{end}', 'video_id': vid,
            'has_audio': vid not in self.no_audio, 'num_frames': self.num_frames,
            'num_samples': int(round(self.clip_seconds * self.sample_rate)),
            'start_s': start / 1e6, 'attributes': None}

  def render_frames(self, index: int, frame_indices) -> np.ndarray:
    vid, start, _, _ = self._row(index)
    idx = np.asarray(frame_indices, np.int64).reshape(-1)
    if idx.size and (idx.min() < 0 or idx.max() >= self.num_frames):
      raise IndexError(f'{self!r}: frame indices must be in [0, {self.num_frames})')
    # Frame k of the clip is the frame on screen at start + k / fps.
    if self.render:
      fps = self._world.fps
      first = int(round(start / 1e6 * fps))
      return self._world.render_frames(vid, (first + idx) / fps)
    from avtext.data import video_io  # pylint: disable=g-import-not-at-top
    return video_io.read_frames(self.videos[vid], start / 1e6 + idx / self.fps)

  def render_audio(self, index: int, start_sample: int = 0,
                   num_samples: int | None = None) -> np.ndarray:
    vid, start, _, _ = self._row(index)
    total = int(round(self.clip_seconds * self.sample_rate))
    n = total - start_sample if num_samples is None else num_samples
    first = int(round(start / 1e6 * self.sample_rate)) + start_sample
    if self.render:
      out = self._world.render_audio(vid, first, n)
    else:
      from avtext.data import video_io  # pylint: disable=g-import-not-at-top
      out = video_io.read_audio(self.videos[vid], first / self.sample_rate,
                                n / self.sample_rate, sample_rate=self.sample_rate)
      out = np.zeros(0, np.float32) if out is None else out
    if len(out) < n:  # a stream a few samples short of the container's end
      out = np.concatenate([out, np.zeros(n - len(out), np.float32)])
    return out

  def __getitem__(self, index: int) -> dict[str, Any]:
    d = self.describe(index)
    frames = self.render_frames(index, np.arange(self.num_frames))
    audio = self.render_audio(index) if d['has_audio'] else np.zeros(0, np.float32)
    return {'frames': frames, 'audio': audio, 'has_audio': d['has_audio'],
            'caption': d['caption'], 'clip_id': d['clip_id'], 'video_id': d['video_id']}


@builders.register_dataset('videocc_mined')
def videocc_mined(dataset: ml_collections.ConfigDict, split: str) -> MinedClips:
  if split != 'train':
    raise ValueError(f'videocc_mined has only a train split (mined pairs are training data), '
                     f'asked for {split!r}; evaluate on another dataset through '
                     'config.evals.<name>.dataset (see configs/videocc_avr.py:mined)')
  if not dataset.get('path'):
    raise errors.BadInput('config.dataset.path: set it to the --out directory of python -m '
                     'avtext.mining')
  return MinedClips(dataset.path, decode=dataset.get('decode', 'files'),
                    fps=dataset.get('fps', 25.0), sample_rate=dataset.get('sample_rate', 16000),
                    num_examples=dataset.get('num_train'))
