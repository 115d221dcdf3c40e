"""Video files in and out with PyAV: probe, frames at given times, audio, and writing.

Reading:
  probe(path)                 -> VideoInfo (duration, fps, size, has_audio); with
                                 need_video=False an audio-only file probes too
                                 (has_video False, the audio stream's duration)
  read_frames(path, times_s)  -> uint8 [N, H, W, 3]: the frame shown at each time (the
                                 last frame whose timestamp is <= t), decoding from a
                                 seek to the earliest time; optional resize on decode
  sample_times(duration, hz)  -> the times of frames at `hz` (VideoCC's 1 fps for mining:
                                 (k + 0.5) / hz, the middle of each period)
  read_audio(path, start, n)  -> float32 mono at `sample_rate` (16 kHz, VideoCC app. C)
                                 or None when the file has no audio stream
  fit_short_side(h, w, s)     -> the decode size with the shorter side s, aspect kept
  verify(path)                -> decodes the streams end to end: catches a file cut
                                 short after a valid index, which probe cannot see
Only the streams asked for are decoded. Clips of a dataset (a span of a file at 25 fps,
audio zero-padded past the file's end, zeros + has_audio False without sound, as VideoCC
app. C) are read through `avtext.data.builders.media_clips.MediaClips`, built on these.

Writing: write_video(path, frames, fps, audio=None) encodes H.264 (libx264, yuv420p)
and AAC mono; write_audio(path, wave) an audio-only file (.wav: 16-bit PCM, else AAC
in .mp4/.m4a). The tests and the demo world (its mining corpus, its layouts of the real
datasets) write their files with them.

Bad input raises `VideoReadError(path, reason, detail)`, a ValueError whose message
names the file and the problem; `reason` is one of REASONS, so callers that may skip
a file (the mining pipeline) count skips by reason:
  missing     no such file
  empty       zero bytes
  unreadable  not a media file FFmpeg can open (a text file named .mp4, a header
              cut off before the index, ...)
  no_video    no video stream (an audio-only file)
  truncated   the video stream ends before a requested time that its declared
              duration covers (a file cut short after its index), the audio stream
              gives fewer samples than its duration declares, or decoding fails
              part-way
A time past the declared duration is a caller error (ValueError, not skipped).
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import re
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
  has_video: bool = True


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
    raise VideoReadError(path, 'unreadable', ffmpeg_message(e)) from e


def ffmpeg_message(error: Exception) -> str:
  """FFmpeg's words for `error`, without PyAV's "[Errno -1094995529]" and the file name
  the skip record already holds: "Invalid data found when processing input"."""
  text = getattr(error, 'strerror', None) or str(error)
  text = re.sub(r'^\[Errno -?\d+\]\s*', '', str(text))
  return re.sub(r":\s*'[^']*'$", '', text).strip() or type(error).__name__


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


def probe(path, *, need_video: bool = True) -> VideoInfo:
  """Duration, frame rate, size and audio presence, from the headers (no decoding).

  need_video=False: a file without a video stream (a .wav, an audio-only .mp4) probes
  too, with has_video False, fps 0 and size 0 x 0 and the audio stream's duration;
  a file with neither stream is still 'no_video'.
  """
  _check_riff_size(path)
  container = _open(path)
  try:
    if not container.streams.video and not need_video and container.streams.audio:
      stream = container.streams.audio[0]
      return VideoInfo(str(path), _stream_duration(container, stream), 0.0, 0, 0, True,
                       has_video=False)
    stream = _video_stream(container, path)
    rate = stream.average_rate or stream.guessed_rate or 0
    return VideoInfo(str(path), _stream_duration(container, stream), float(rate),
                     int(stream.codec_context.width), int(stream.codec_context.height),
                     bool(container.streams.audio))
  finally:
    container.close()


def _check_riff_size(path) -> None:
  """A .wav cut short: FFmpeg takes its duration from the file's size, so only the RIFF
  header's own size (bytes 4-8) tells that bytes are missing."""
  p = pathlib.Path(path)
  if p.suffix.lower() != '.wav' or not p.is_file():
    return
  with open(p, 'rb') as f:
    head = f.read(12)
  if len(head) == 12 and head[:4] == b'RIFF' and head[8:12] == b'WAVE':
    declared = int.from_bytes(head[4:8], 'little') + 8
    size = p.stat().st_size
    if size < declared:
      raise VideoReadError(path, 'truncated', f'{size} of the {declared} bytes its RIFF '
                           'header declares')


def fit_short_side(height: int, width: int, short_side: int | None) -> tuple[int, int]:
  """(h, w) with the shorter side `short_side` and the aspect ratio kept (even sizes,
  as most pipelines resize); (height, width) when short_side is None."""
  if not short_side:
    return height, width
  scale = short_side / min(height, width)
  even = lambda v: max(2, int(round(v * scale / 2)) * 2)
  return (short_side, even(width)) if height <= width else (even(height), short_side)


def verify(path, *, video: bool = True, audio: bool = False) -> VideoInfo:
  """Probes, then decodes the asked-for streams end to end; raises VideoReadError
  ('truncated') when a stream stops well before its declared duration or fails to
  decode. Costs one full decode: for datasets' `verify="decode"` option."""
  import av  # pylint: disable=g-import-not-at-top
  info = probe(path, need_video=video)
  container = _open(path)
  try:
    kinds = ([container.streams.video[0]] if video and info.has_video else []) + (
        [container.streams.audio[0]] if audio and info.has_audio else [])
    for stream in kinds:
      last, tb = -np.inf, stream.time_base
      rate = float(getattr(stream, 'average_rate', None) or 0) or 25.0
      try:
        container.seek(0)
        for frame in container.decode(stream):
          if frame.pts is not None:
            last = float(frame.pts * tb)
      except av.error.FFmpegError as e:
        raise VideoReadError(path, 'truncated', f'{stream.type} decoding failed after '
                             f'{max(last, 0):.2f} s: {ffmpeg_message(e)}') from e
      tolerance = 2.0 / rate if stream.type == 'video' else 0.25
      if info.duration_s - last > tolerance + (1.0 / rate if stream.type == 'video' else 0):
        raise VideoReadError(path, 'truncated', f'{stream.type} ends at {max(last, 0):.2f} s '
                             f'of {info.duration_s:.2f} s')
  finally:
    container.close()
  return info


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
      raise VideoReadError(path, 'truncated',
                           f'decoding failed after {last_t:.2f} s: {ffmpeg_message(e)}') from e
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
    # The stream's header promises samples up to its duration: fewer means a cut file,
    # not silence (a caller padding with zeros would feed a silent clip as data).
    declared = _stream_duration(container, stream)
    end_s = declared if duration_s is None else min(start_s + duration_s, declared)
    if np.isfinite(declared) and len(wave) < (end_s - start_s - 0.1) * sample_rate:
      raise VideoReadError(path, 'truncated', f'audio ends at '
                           f'{start_s + len(wave) / sample_rate:.2f} s of {declared:.2f} s')
    return wave if need is None else wave[:need]
  finally:
    container.close()


def write_video(path, frames: np.ndarray, fps: float, *, audio: np.ndarray | None = None,
                sample_rate: int = 16000, crf: int = 18, faststart: bool = False) -> None:
  """Encode uint8 [T, H, W, 3] frames (H, W even) as H.264 and `audio` (float32 mono in
  [-1, 1]) as AAC into an .mp4: index at the end, as most encoders write it, or at the
  start with `faststart` (as streaming sites serve files).

  The same arguments give the same bytes: x264's macroblock-tree rate control (mbtree,
  on by default) is off, as with it the same frames encoded twice in one process came
  out different in ~1 of 6 encodes (the first GOP's QPs; BENCHMARKS.md "Determinism of
  the mined set")."""
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
    vs.options = {'crf': str(crf), 'preset': 'veryfast', 'x264-params': 'mbtree=0'}
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


def write_audio(path, wave: np.ndarray, *, sample_rate: int = 16000) -> None:
  """float32 mono `wave` in [-1, 1] as an audio-only file: 16-bit PCM for a .wav,
  AAC in an mp4 container otherwise (an '.mp4' without a video stream)."""
  import av  # pylint: disable=g-import-not-at-top
  wave = np.clip(np.asarray(wave, np.float32).reshape(1, -1), -1.0, 1.0)
  wav = pathlib.Path(path).suffix.lower() == '.wav'
  with av.open(os.fspath(path), 'w', format='wav' if wav else 'mp4') as container:
    stream = container.add_stream('pcm_s16le' if wav else 'aac', rate=sample_rate,
                                  layout='mono')
    block = 1024
    for a in range(0, wave.shape[1], block):
      chunk = np.ascontiguousarray(wave[:, a:a + block])
      if wav:
        # FFmpeg decodes s16 as x / 32768: the same scale, so a sample comes back
        # within half a quantization step.
        chunk = np.clip(np.round(chunk * 32768), -32768, 32767).astype(np.int16)
      frame = av.AudioFrame.from_ndarray(chunk, format='s16' if wav else 'flt', layout='mono')
      frame.sample_rate, frame.pts = sample_rate, a
      container.mux(stream.encode(frame))
    container.mux(stream.encode(None))


FAULTS = ('truncated', 'empty', 'not_video', 'audio_only', 'short', 'no_audio')


def write_fault(path, kind: str | None, frames: np.ndarray, fps: float, *,
                audio: np.ndarray | None = None, sample_rate: int = 16000,
                short_s: float = 0.2) -> None:
  """The video (frames, audio) written as `kind` of bad input, or as itself (None):
    truncated   cut to 60 % of its bytes, written with its index first (faststart), so
                it opens and its frames stop early
    empty       zero bytes
    not_video   a text file with the video's name
    audio_only  the audio alone (AAC in an mp4 container, no video stream)
    short       its first `short_s` seconds
    no_audio    the frames without an audio stream
  The tests, the mining corpus and the synthetic dataset layouts plant them."""
  if kind is not None and kind not in FAULTS:
    raise ValueError(f'write_fault: unknown kind {kind!r}; expected one of {FAULTS}')
  path = pathlib.Path(path)
  if kind == 'empty':
    path.write_bytes(b'')
  elif kind == 'not_video':
    path.write_text('this is not a video\n' * 20)
  elif kind == 'audio_only':
    if audio is None:
      raise ValueError('write_fault: audio_only needs the audio')
    write_audio(path, audio, sample_rate=sample_rate)
  else:
    if kind == 'short':
      frames = frames[:max(1, int(round(short_s * fps)))]
      audio = None if audio is None else audio[:int(round(short_s * sample_rate))]
    write_video(path, frames, fps, audio=None if kind == 'no_audio' else audio,
                sample_rate=sample_rate, faststart=(kind == 'truncated'))
    if kind == 'truncated':
      data = path.read_bytes()
      path.write_bytes(data[:int(len(data) * 0.6)])
