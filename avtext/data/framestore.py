r"""Clips stored frame by frame: the materialized format whose reads decode only the frames
a clip uses (`python -m avtext.materialize --format=frames_jpeg`, read back as the dataset
`frames:<name>`, `builders.frames`).

The TFDS format (`--format=tfds`) keeps a clip's frames in one zlib'd tensor, so a training
read inflates 26 s of video to use 32 frames. Here every frame is its own array_record
record, encoded alone (FORMATS):

  frames_jpeg   JPEG at `quality` (default 95) with 4:4:4 chroma: against PyAV's decode of
                the mp4, 39.9-41.1 dB PSNR per frame on tests/test_data_framestore.py's
                textured frames, where 4:2:0 (re-subsampling the decoded chroma) gave
                32-33 dB; 4:4:4 costs ~0.2 ms more decoding per 224 px frame
  frames_png    PNG: lossless
  frames_raw    the uint8 pixels: lossless, nothing to decode, the largest

and a read (`FrameClips.render_frames`) fetches and decodes the sampled frames alone; the
frame indices come from the sampler the mp4 path uses (`pipelines.ClipExamples`), over
`num_frames` = the frames the source had at its fps. Audio (16 kHz mono float32, exactly
as the source decoded it) is stored in records of AUDIO_CHUNK_S seconds, so a spectrogram
window reads the seconds it covers.

Layout of <data_dir>/<name>/<split>/ (`write` builds it in <split>.incomplete/ and renames
it when complete, replacing an earlier one):

  info.json                      format, quality, sample_rate, audio_chunk_s, source (the
                                 dataset and split stored) and the records of each kind
  clips.array_record-NNNNN-of-NNNNN    one JSON record per clip: caption, clip_id,
                                 video_id, has_audio, num_frames, height, width,
                                 num_samples and the index of its first frame / audio record
  frames.array_record-NNNNN-of-NNNNN   one record per frame, each clip's in order
  audio.array_record-NNNNN-of-NNNNN    AUDIO_CHUNK_S-second records of audio

The three kinds of file roll to a new shard together, at a clip boundary, once a frames
shard holds `shard_bytes`; indices count across shards.
"""
from __future__ import annotations

import concurrent.futures
import io
import json
import os
import pathlib
import re
import shutil
from typing import Any, Iterable

import numpy as np

from avtext.data import builders

FORMATS = ('frames_jpeg', 'frames_png', 'frames_raw')
KINDS = ('clips', 'frames', 'audio')
AUDIO_CHUNK_S = 1.0
_OPTIONS = 'group_size:1,uncompressed'  # one record per read; JPEG / PNG do not deflate
_PIL_FORMAT = {'frames_jpeg': 'JPEG', 'frames_png': 'PNG'}


# ---- codecs ----------------------------------------------------------------------------

def encode_frame(frame: np.ndarray, fmt: str, quality: int = 95) -> bytes:
  """uint8 [H, W, 3] as one record of `fmt`."""
  if fmt == 'frames_raw':
    return np.ascontiguousarray(frame, np.uint8).tobytes()
  from PIL import Image  # pylint: disable=g-import-not-at-top
  buf = io.BytesIO()
  if fmt == 'frames_jpeg':
    Image.fromarray(frame).save(buf, format='JPEG', quality=quality, subsampling=0)
  else:
    Image.fromarray(frame).save(buf, format='PNG', compress_level=1)
  return buf.getvalue()


def decode_frame(blob: bytes, fmt: str, height: int, width: int) -> np.ndarray:
  """uint8 [height, width, 3] of one record of `fmt`."""
  if fmt == 'frames_raw':
    return np.frombuffer(blob, np.uint8).reshape(height, width, 3)
  from PIL import Image  # pylint: disable=g-import-not-at-top
  image = Image.open(io.BytesIO(blob), formats=(_PIL_FORMAT[fmt],))
  return np.asarray(image if image.mode == 'RGB' else image.convert('RGB'))


# ---- files -----------------------------------------------------------------------------

def _shards(split_dir: pathlib.Path, kind: str) -> list[str]:
  pattern = re.compile(rf'{kind}\.array_record-\d{{5}}-of-(\d{{5}})$')
  names = sorted(n for n in os.listdir(split_dir) if pattern.match(n))
  if not names or len(names) != int(pattern.match(names[0]).group(1)):
    raise FileNotFoundError(f'{split_dir}: {len(names)} {kind}.array_record shards, expected '
                            f'{kind}.array_record-NNNNN-of-NNNNN; materialize the split again')
  return [str(split_dir / n) for n in names]


class _Writer:
  """The array_record files of one split, in <split>.incomplete/ until `close`."""

  def __init__(self, split_dir: pathlib.Path, info: dict, shard_bytes: int):
    self.final, self.dir = split_dir, split_dir.with_name(split_dir.name + '.incomplete')
    shutil.rmtree(self.dir, ignore_errors=True)
    self.dir.mkdir(parents=True)
    self.info, self.chunk = info, int(round(AUDIO_CHUNK_S * info['sample_rate']))
    self.shard_bytes, self.shard, self.frame_bytes = shard_bytes, -1, 0
    self.counts = dict.fromkeys(KINDS, 0)
    self.writers: dict[str, Any] = {}
    self._roll()

  def _roll(self) -> None:
    from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
    for w in self.writers.values():
      w.close()
    self.shard += 1
    self.frame_bytes = 0
    self.writers = {k: array_record_module.ArrayRecordWriter(
        str(self.dir / f'{k}.array_record-{self.shard:05d}'), _OPTIONS) for k in KINDS}

  def add(self, meta: dict, frames: Iterable[bytes], audio: np.ndarray) -> None:
    if self.frame_bytes >= self.shard_bytes:
      self._roll()
    meta = {**meta, 'first_frame': self.counts['frames'], 'first_audio': self.counts['audio']}
    for blob in frames:
      self.writers['frames'].write(blob)
      self.frame_bytes += len(blob)
      self.counts['frames'] += 1
    for a in range(0, len(audio), self.chunk):
      self.writers['audio'].write(np.asarray(audio[a:a + self.chunk], '<f4').tobytes())
      self.counts['audio'] += 1
    self.writers['clips'].write(json.dumps(meta).encode())
    self.counts['clips'] += 1

  def close(self) -> int:
    """Names the shards -NNNNN-of-NNNNN, writes info.json, renames the split into place."""
    for w in self.writers.values():
      w.close()
    n = self.shard + 1
    for k in KINDS:
      for s in range(n):
        os.replace(self.dir / f'{k}.array_record-{s:05d}',
                   self.dir / f'{k}.array_record-{s:05d}-of-{n:05d}')
    (self.dir / 'info.json').write_text(json.dumps({**self.info, **self.counts}, indent=1))
    shutil.rmtree(self.final, ignore_errors=True)
    os.replace(self.dir, self.final)
    return self.counts['clips']


def write(root: str | pathlib.Path, split: str, records: Iterable[dict], *, fmt: str,
          quality: int = 95, sample_rate: int = 16000, source: str = '', workers: int = 4,
          shard_bytes: int = 1 << 30) -> int:
  """Stores `records` (whole clips: 'frames' uint8 [T, H, W, 3], or 'num_frames' and no
  frames for an audio dataset; 'audio' float32 at `sample_rate`, 'has_audio', 'caption',
  'clip_id', 'video_id') as split `split` of the store at `root`, encoding `workers`
  frames at a time; returns the clips written. `source` names what was stored."""
  if fmt not in FORMATS:
    raise ValueError(f'framestore: format {fmt!r} is not one of {FORMATS}')
  info = {'format': fmt, 'quality': quality if fmt == 'frames_jpeg' else None,
          'sample_rate': sample_rate, 'audio_chunk_s': AUDIO_CHUNK_S, 'source': source}
  writer = _Writer(pathlib.Path(root) / split, info, shard_bytes)
  encode = lambda f: encode_frame(f, fmt, quality)  # noqa: E731
  with concurrent.futures.ThreadPoolExecutor(max(1, workers)) as pool:  # PIL frees the GIL
    for r in records:
      frames = r.get('frames')
      height, width = (0, 0) if frames is None else np.shape(frames)[1:3]
      meta = {k: r[k] for k in ('caption', 'clip_id', 'video_id', 'has_audio')}
      meta.update(num_frames=int(r['num_frames'] if frames is None else len(frames)),
                  height=int(height), width=int(width), num_samples=len(r['audio']))
      writer.add(meta, () if frames is None else pool.map(encode, frames), r['audio'])
  return writer.close()


# ---- reading ---------------------------------------------------------------------------

class FrameClips:
  """Split `split` of the store at `root` as a 'clips' source (`builders`): describe(i),
  render_frames(i, idx) (decodes those frames only), render_audio(i, start, n) and
  __getitem__(i) (the whole clip, as the TFDS format's record)."""
  kind = builders.CLIPS

  def __init__(self, root: str | pathlib.Path, split: str):
    from array_record.python import array_record_data_source as ards  # pylint: disable=g-import-not-at-top
    self.root, self.split = pathlib.Path(root), split
    info = self.root / split / 'info.json'
    if not info.is_file():
      stored = sorted(p.parent.name for p in self.root.glob('*/info.json'))
      raise FileNotFoundError(f'{info}: not found (stored splits: {stored or "none"}); write '
                              f'it with python -m avtext.materialize --splits={split} '
                              '--format=frames_jpeg (docs/videocc.md, "Datasets")')
    self.info = json.loads(info.read_text())
    self.format = self.info['format']
    self._chunk = int(round(self.info['audio_chunk_s'] * self.info['sample_rate']))
    self._files = {k: ards.ArrayRecordDataSource(_shards(self.root / split, k))
                   for k in KINDS}

  def __len__(self) -> int:
    return len(self._files['clips'])

  def __repr__(self) -> str:
    return f'FrameClips({self.root} {self.split!r}: {len(self)} clips, {self.format})'

  def _clip(self, index: int) -> dict:
    i = int(index)
    if not 0 <= i < len(self):
      raise IndexError(f'{self!r}: index {index} out of range')
    return json.loads(self._files['clips'][i])

  def describe(self, index: int) -> dict[str, Any]:
    return {**self._clip(index), 'attributes': None}

  def render_frames(self, index: int, frame_indices) -> np.ndarray:
    c = self._clip(index)
    idx = np.asarray(frame_indices, np.int64).reshape(-1)
    if not c['height']:
      raise ValueError(f'{self!r}: clip {index} stores no frames (an audio dataset); set '
                       'config.model.video.modalities="audio"')
    if idx.size and (idx.min() < 0 or idx.max() >= c['num_frames']):
      raise IndexError(f'{self!r}: clip {index} has {c["num_frames"]} frames, asked for '
                       f'{idx.min()}..{idx.max()}')
    unique, inverse = np.unique(idx, return_inverse=True)
    blobs = self._files['frames'].__getitems__([c['first_frame'] + int(k) for k in unique])
    frames = [decode_frame(b, self.format, c['height'], c['width']) for b in blobs]
    return np.stack([frames[k] for k in inverse.reshape(-1)]) if idx.size else np.zeros(
        (0, c['height'], c['width'], 3), np.uint8)

  def render_audio(self, index: int, start_sample: int = 0,
                   num_samples: int | None = None) -> np.ndarray:
    c = self._clip(index)
    total, chunk = c['num_samples'], self._chunk
    start = max(int(start_sample), 0)
    n = total - start if num_samples is None else int(num_samples)
    out = np.zeros(max(n, 0), np.float32)
    stop = min(start + n, total)
    if stop <= start:
      return out
    first, last = start // chunk, (stop - 1) // chunk
    wave = np.frombuffer(b''.join(self._files['audio'].__getitems__(
        [c['first_audio'] + k for k in range(first, last + 1)])), '<f4')
    part = wave[start - first * chunk:stop - first * chunk]
    out[:len(part)] = part
    return out

  def __getitem__(self, index: int) -> dict[str, Any]:
    c = self._clip(index)
    out = {k: c[k] for k in ('caption', 'clip_id', 'video_id', 'has_audio')}
    if c['height']:
      out['frames'] = self.render_frames(index, np.arange(c['num_frames']))
    out['audio'] = self.render_audio(index)
    return out
