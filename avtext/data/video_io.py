"""Video files in and out with PyAV: probe, frames at given times, audio, and writing.

Reading:
  probe(path)                 -> VideoInfo (duration, fps, size, has_audio)
  read_frames(path, times_s)  -> uint8 [N, H, W, 3]: the frame shown at each time (the
                                 last frame whose timestamp is <= t), decoding from a
                                 seek to the earliest time; optional resize on decode
  sample_times(duration, hz)  -> the times of frames at `hz` (VideoCC's 1 fps for mining:
                                 (k + 0.5) / hz, the middle of each period)
  read_audio(path, start, n)  -> float32 mono at `sample_rate` (16 kHz, VideoCC app. C)
                                 or None when the file has no audio stream
Only the stream asked for is decoded.

Writing: write_video(path, frames, fps, audio=None) encodes H.264 (libx264, yuv420p)
and AAC mono; the tests and the synthetic mining corpus write their files with it.

Bad input raises `VideoReadError(path, reason, detail)`, a ValueError whose message
names the file and the problem; `reason` is one of REASONS, so callers that may skip
a file (the mining pipeline) count skips by reason:
  missing     no such file
  empty       zero bytes
  unreadable  not a media file FFmpeg can open (a text file named .mp4, a header
              cut off before the index, ...)
  no_video    no video stream (an audio-only file)
  truncated   the video stream ends before a requested time that its declared
              duration covers (a file cut short after its index), or decoding fails
              part-way
A time past the declared duration is a caller error (ValueError, not skipped).
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Sequence

import numpy as np

REASONS = ('missing', 'empty', 'unreadable', 'no_video', 'truncated')


class VideoReadError(ValueError):
  """A video file that cannot be read as asked: `path`, `reason` (REASONS), detail."""

  def __init__(self, path, reason: str, detail: str = ''):
    if reason not in REASONS:
      raise ValueError(f'VideoReadError: unknown reason {reason!r}; expected one of {REASONS}')
    self.path, self.reason, self.detail = str(path), reason, detail
    super().__init__(f'{path}: {reason}' + (f' ({detail})' if detail else ''))


@dataclasses.dataclass(frozen=True)
class VideoInfo:
  path: str
  duration_s: float  # the video stream's (the container's when the stream has none)
  fps: float
  width: int
  height: int
  has_audio: bool


def _open(path):
  import av  # pylint: disable=g-import-not-at-top
  p = pathlib.Path(path)
  if not p.exists():
    raise VideoReadError(path, 'missing')
  if p.stat().st_size == 0:
    raise VideoReadError(path, 'empty')
  try:
    return av.open(os.fspath(p))
  except (av.error.FFmpegError, UnicodeDecodeError) as e:
    raise VideoReadError(path, 'unreadable', str(e)) from e


def _video_stream(container, path):
  if not container.streams.video:
    container.close()
    raise VideoReadError(path, 'no_video',
                         f'streams: {[s.type for s in container.streams] or "none"}')
  return container.streams.video[0]


def _stream_duration(container, stream) -> float:
  if stream.duration is not None and stream.time_base is not None:
    return float(stream.duration * stream.time_base)
  if container.duration is not None:
    return container.duration / 1_000_000
  return float('nan')


def probe(path) -> VideoInfo:
  """Duration, frame rate, size and audio presence, from the headers (no decoding)."""
  container = _open(path)
  try:
    stream = _video_stream(container, path)
    rate = stream.average_rate or stream.guessed_rate or 0
    return VideoInfo(str(path), _stream_duration(container, stream), float(rate),
                     int(stream.codec_context.width), int(stream.codec_context.height),
                     bool(container.streams.audio))
  finally:
    container.close()


def sample_times(duration_s: float, hz: float = 1.0) -> np.ndarray:
  """float64 [floor(duration * hz)]: (k + 0.5) / hz, one frame per period."""
  if hz <= 0:
    raise ValueError(f'sample_times: hz must be > 0, got {hz}')
  return (np.arange(int(np.floor(duration_s * hz + 1e-9))) + 0.5) / hz


def read_frames(path, times_s: Sequence[float] | np.ndarray, *,
                size: tuple[int, int] | None = None) -> np.ndarray:
  """uint8 [N, H, W, 3]: the frame shown at each time; `size` = (height, width) resizes.

  Times must lie in [0, duration]; they may come in any order. Decoding starts at a
  seek to the earliest time and stops after the latest.
  """
  import av  # pylint: disable=g-import-not-at-top
  times = np.asarray(times_s, np.float64).reshape(-1)
  container = _open(path)
  try:
    stream = _video_stream(container, path)
    duration = _stream_duration(container, stream)
    if times.size and (times.min() < 0 or times.max() > duration + 1e-6):
      raise ValueError(f'{path}: frame times must be in [0, {duration:.3f}] s, got '
                       f'{times.min():.3f}..{times.max():.3f}')
    h, w = size if size is not None else (stream.codec_context.height,
                                          stream.codec_context.width)
    out = np.zeros((len(times), h, w, 3), np.uint8)
    if not times.size:
      return out
    order = np.argsort(times, kind='stable')
    tb = stream.time_base
    stream.thread_type = 'AUTO'
    container.seek(int(times[order[0]] / tb), stream=stream, backward=True, any_frame=False)
    j, prev, last_t = 0, None, -np.inf
    try:
      for frame in container.decode(stream):
        t = float(frame.pts * tb) if frame.pts is not None else last_t
        # Frames before the next time are only remembered; a frame at or after
        # it means the previous one was on screen at that time.
        while j < len(order) and t > times[order[j]] + 1e-6:
          if prev is None:  # a seek that landed after the time: take this frame
            prev = frame
          out[order[j]] = _rgb(prev, h, w)
          j += 1
        if j == len(order):
          break
        prev, last_t = frame, t
    except av.error.FFmpegError as e:
      raise VideoReadError(path, 'truncated', f'decoding failed after {last_t:.2f} s: {e}') from e
    if j < len(order):
      if prev is None or duration - last_t > 2.0 / max(float(stream.average_rate or 1), 1.0):
        raise VideoReadError(path, 'truncated',
                             f'frames end at {max(last_t, 0):.2f} s of {duration:.2f} s; '
                             f'asked for {times[order[j]]:.2f} s')
      # The last frame stays on screen up to the end of the stream.
      while j < len(order):
        out[order[j]] = _rgb(prev, h, w)
        j += 1
    return out
  finally:
    container.close()


def _rgb(frame, h: int, w: int) -> np.ndarray:
  return frame.to_ndarray(format='rgb24', width=w, height=h)


def read_audio(path, start_s: float = 0.0, duration_s: float | None = None, *,
               sample_rate: int = 16000) -> np.ndarray | None:
  """float32 mono [n] from start_s for duration_s (to the end when None), or None when
  the file has no audio stream. Shorter when the stream ends first (callers pad)."""
  import av  # pylint: disable=g-import-not-at-top
  container = _open(path)
  try:
    if not container.streams.audio:
      return None
    stream = container.streams.audio[0]
    if start_s > 0:
      container.seek(int(start_s / stream.time_base), stream=stream, backward=True)
    resampler = av.AudioResampler(format='flt', layout='mono', rate=sample_rate)
    chunks, first_t = [], None
    need = None if duration_s is None else int(round(duration_s * sample_rate))
    start = int(round(start_s * sample_rate))
    got = 0
    try:
      for frame in container.decode(stream):
        if first_t is None:
          first_t = float(frame.pts * stream.time_base) if frame.pts is not None else 0.0
        for out in resampler.resample(frame):
          chunks.append(out.to_ndarray().reshape(-1))
          got += chunks[-1].size
        if need is not None and got >= need + (start - int(round(first_t * sample_rate))):
          break
      for out in resampler.resample(None):
        chunks.append(out.to_ndarray().reshape(-1))
    except av.error.FFmpegError as e:
      raise VideoReadError(path, 'truncated', f'audio decoding failed: {e}') from e
    wave = np.concatenate(chunks).astype(np.float32) if chunks else np.zeros(0, np.float32)
    offset = max(0, start - int(round((first_t or 0.0) * sample_rate)))
    wave = wave[offset:]
    return wave if need is None else wave[:need]
  finally:
    container.close()


def write_video(path, frames: np.ndarray, fps: float, *, audio: np.ndarray | None = None,
                sample_rate: int = 16000, crf: int = 18, faststart: bool = False) -> None:
  """Encode uint8 [T, H, W, 3] frames (H, W even) as H.264 and `audio` (float32 mono in
  [-1, 1]) as AAC into an .mp4: index at the end, as most encoders write it, or at the
  start with `faststart` (as streaming sites serve files)."""
  import av  # pylint: disable=g-import-not-at-top
  frames = np.asarray(frames)
  if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
    raise ValueError(f'write_video: frames must be uint8 [T, H, W, 3], got '
                     f'{frames.dtype} {frames.shape}')
  from fractions import Fraction  # pylint: disable=g-import-not-at-top
  options = {'movflags': '+faststart'} if faststart else {}
  with av.open(os.fspath(path), 'w', format='mp4', options=options) as container:
    vs = container.add_stream('libx264', rate=Fraction(fps).limit_denominator(1001))
    vs.height, vs.width = frames.shape[1:3]
    vs.pix_fmt = 'yuv420p'
    vs.options = {'crf': str(crf), 'preset': 'veryfast'}
    as_ = None
    if audio is not None:
      as_ = container.add_stream('aac', rate=sample_rate, layout='mono')
    for t, img in enumerate(frames):
      frame = av.VideoFrame.from_ndarray(img, format='rgb24')
      frame.pts = t
      container.mux(vs.encode(frame))
    container.mux(vs.encode(None))
    if as_ is not None:
      wave = np.clip(np.asarray(audio, np.float32).reshape(1, -1), -1.0, 1.0)
      block = 1024
      for a in range(0, wave.shape[1], block):
        chunk = np.ascontiguousarray(wave[:, a:a + block])
        frame = av.AudioFrame.from_ndarray(chunk, format='flt', layout='mono')
        frame.sample_rate, frame.pts = sample_rate, a
        container.mux(as_.encode(frame))
      container.mux(as_.encode(None))
