"""Host-side audio preprocessing: log-mel spectrograms, their segments, speech features.

numpy on the CPU, one example at a time inside the grain input pipeline, as
`avtext.data.video`. The conventions follow VideoCC (Nagrani et al. 2022)
app. C: 16 kHz mono audio, 128-bin log-mel spectrograms with a 25 ms Hamming
window and a 10 ms hop (100 frames per second); 8 spectrograms of 1 s, 3 s
apart, form one 800 x 128 input covering 24 s; missing audio is fed as zeros.
S-MiT's spoken captions are 40-bin log-mel spectrograms of the same front end
(`speech_features`).
"""
import functools
import math
from typing import Sequence

import numpy as np

from avtext.data import video

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


# ----------------------------------------------------------------------------
# Audio aligned with the frames (VideoCC §4.1, app. C)
# ----------------------------------------------------------------------------


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
  video.check_positive(num_segments=num_segments, segment_frames=segment_frames,
                       segment_stride_frames=segment_stride_frames)
  length = max(length, segment_frames)
  span = (num_segments - 1) * segment_stride_frames + segment_frames
  if span <= length:
    max_start = length - span
    first = max_start // 2 if start is None else min(max(int(start), 0), max_start)
    starts = first + segment_stride_frames * np.arange(num_segments)
  else:
    starts = video.spread_indices(length - segment_frames + 1, num_segments)
  return (starts[:, None] + np.arange(segment_frames)).reshape(-1)



# ----------------------------------------------------------------------------
# Log-mel spectrograms (VideoCC app. C)
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
def _sparse_mel_weights_t(*args):
  """CSR [num_mel_bins, fft_length // 2 + 1] of `mel_weight_matrix(*args)`.

  Each FFT bin feeds at most two mel bands; a sparse product is ~10x faster
  than dense BLAS here and stays single-threaded, which matters in input
  workers sharing the CPU (multi-threaded OpenBLAS measured 5-20x slower under
  load).
  """
  import scipy.sparse  # pylint: disable=g-import-not-at-top  (a second of imports)
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
  import scipy.fft  # pylint: disable=g-import-not-at-top  (scipy's imports take a second)
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
  video.check_positive(num_frames=num_frames)
  segment_frames = segment_frames or num_frames
  if num_frames % segment_frames:
    raise ValueError(f"num_frames ({num_frames}) must be a multiple of segment_frames "
                     f"({segment_frames})")
  if waveform is None or np.size(waveform) == 0:
    return np.zeros((num_frames, num_mel_bins), np.float32), False
  wave = to_mono(waveform)
  if sample_rate != SAMPLE_RATE:
    g = math.gcd(int(sample_rate), SAMPLE_RATE)
    import scipy.signal  # pylint: disable=g-import-not-at-top
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
# Spoken captions (S-MiT sec. 4.2.2)
# ----------------------------------------------------------------------------


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
