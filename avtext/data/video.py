"""Host-side video preprocessing: temporal frame sampling and RGB crops.

Everything here is numpy on the CPU and runs inside the grain input pipeline,
one example at a time, so each function is written for speed and takes its
randomness from an explicit `np.random.Generator` (the audio side is
`avtext.data.audio`).

The conventions follow VideoCC (Nagrani et al. 2022) §5.2 "Clip coverage" /
app. D.1: one segment of `num_samples` frames at a frame stride is sampled at
a random start for training (32 frames at stride 14 at 25 fps cover ~18 s); at
test time §4.1 samples K = 4 clips equally spaced over the video and averages
their similarity scores. COOT samples frames as its official code does
(`coot_frame_indices`, `expand_segment`).
"""
import math
from typing import Sequence

import numpy as np
from PIL import Image

# ViT/MBT "zero centring": pixels in [0, 1] map to [-1, 1].
IMAGE_MEAN = (0.5, 0.5, 0.5)
IMAGE_STD = (0.5, 0.5, 0.5)


# ----------------------------------------------------------------------------
# Temporal sampling (VideoCC §4.1, §5.2 "Clip coverage", app. C)
# ----------------------------------------------------------------------------


def check_positive(**values: int) -> None:
  """Raises ValueError naming the first of `values` (name=count) below 1."""
  for name, value in values.items():
    if value < 1:
      raise ValueError(f"{name} must be >= 1, got {value}")


def spread_indices(length: int, num_samples: int) -> np.ndarray:
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
  check_positive(num_frames=num_frames, num_samples=num_samples, stride=stride)
  span = (num_samples - 1) * stride + 1
  if span > num_frames:
    return spread_indices(num_frames, num_samples)
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
  check_positive(num_frames=num_frames, num_samples=num_samples, stride=stride,
                 num_clips=num_clips)
  span = (num_samples - 1) * stride + 1
  if span > num_frames or num_clips == 1:
    return np.tile(sample_frame_indices(num_frames, num_samples, stride), (num_clips, 1))
  starts = np.floor(np.linspace(0, num_frames - span, num_clips) + 0.5).astype(np.int32)
  return starts[:, None] + stride * np.arange(num_samples, dtype=np.int32)


# The name is the paper's; keep pytest from collecting it as a test when a test
# module imports it by name.
test_clip_indices.__test__ = False


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
