"""Clip features from a trained RGB tower: the synthetic datasets' stand-in for I3D / ResNet.

The video encoder the synthetic COOT and TVR / TVC writers are given
(`avtext.tools.coot_synthetic`, `avtext.tools.tvr_synthetic`), and the mining
embedder's tower. A feature step is the [CLS] embedding of the tower in a run
directory (`configs/synthetic_video_pretrain.py`) on its own input:
`data.num_frames` frames `data.frame_stride` apart around the step's centre
(clamped to the video), normalized as in training.
"""
import functools

import jax
import numpy as np
from tqdm import tqdm

from avtext import runs as runs_lib
from avtext.data import video as video_lib

FRAME_FIELDS = ("height", "width", "fps")  # of the world a tower was trained on


def tower_from_run(workdir, step=None):
  """(apply_fn uint8 [B, F, H, W, 3] -> [B, D], frames per window, stride, frames) of the
  run's checkpoint `step` (None: the latest; N; "best"); frames: the height, width and fps
  of the world the run trained on ({} when its config names none: the world's defaults)."""
  run = runs_lib.load_run(workdir, step)
  data = run.config.data
  video = run.model.video
  params = run.params["video"]
  size = int(data.image_size)

  @jax.jit
  def embed(x):
    return video.apply({"params": params}, {"rgb": x}, train=False)["embedding"]

  def apply_fn(frames: np.ndarray) -> np.ndarray:
    b, f = frames.shape[:2]
    flat = video_lib.resize_crop_normalize(frames.reshape((-1,) + frames.shape[2:]),
                                           size=size, train=False)
    return np.asarray(embed(flat.reshape((b, f) + flat.shape[1:]).astype(np.float32)))

  world_cfg = run.config.dataset.get("world")
  frames = {k: world_cfg[k] for k in FRAME_FIELDS} if world_cfg else {}
  return apply_fn, int(data.num_frames), int(data.frame_stride), frames


def window_frames(num_frames: int, fps: float, feature_fps: float, frames_per_window: int,
                  stride: int, num_steps: int | None = None) -> np.ndarray:
  """int [T, frames_per_window]: the frames each feature step sees (clamped to the video).

  T = num_steps, default the whole steps in the video (at least 1); step k is
  centred at (k + 0.5) / feature_fps seconds.
  """
  steps = num_steps or max(1, int(np.floor(num_frames / fps * feature_fps)))
  centres = np.round((np.arange(steps) + 0.5) / feature_fps * fps)
  offsets = stride * (np.arange(frames_per_window) - (frames_per_window - 1) / 2)
  return np.clip(np.round(centres[:, None] + offsets[None]), 0, num_frames - 1).astype(np.int64)


def extract_video_features(source, indices, *, apply_fn, frames_per_window: int,
                           frame_stride: int, feature_fps: float, batch_size: int = 256,
                           num_steps=None) -> dict[str, np.ndarray]:
  """{video_id: float32 [T, D]} for `indices` of a `MultiSceneSource` (see the module doc).

  num_steps: None (whole steps) or `index -> T` (e.g. TVR's ceil(duration / 1.5)).
  """
  jobs = []  # (video id, step, frame indices)
  for i in indices:
    windows = window_frames(source.num_frames(i), source.spec.fps, feature_fps,
                            frames_per_window, frame_stride,
                            num_steps(i) if num_steps else None)
    jobs += [(i, t, w) for t, w in enumerate(windows)]
  out: dict[int, list] = {}
  for start in tqdm(range(0, len(jobs), batch_size), desc="video features", unit="batch"):
    chunk = jobs[start:start + batch_size]
    frames = np.stack([source.render_frames(i, w) for i, _, w in chunk])
    emb = apply_fn(frames)
    for (i, _, _), e in zip(chunk, emb):
      out.setdefault(i, []).append(e)
  return {source.video_id(i): np.stack(v).astype(np.float32) for i, v in out.items()}


def tower_encoder(workdir, step=None):
  """(video_features, frames) of the run's tower: the encoder the synthetic writers take,
  and the frame size and rate of its world (`tower_from_run`).

  video_features(source, indices, *, feature_fps, num_steps=None) is
  `extract_video_features` with the tower's apply_fn, window and stride.
  """
  apply_fn, frames_per_window, stride, frames = tower_from_run(workdir, step)
  return functools.partial(extract_video_features, apply_fn=apply_fn,
                           frames_per_window=frames_per_window, frame_stride=stride), frames
