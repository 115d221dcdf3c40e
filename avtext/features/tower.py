"""Clip features from a trained RGB tower: a stand-in for I3D / ResNet features.

The video encoder of the mining embedder and of writers of COOT and TVR / TVC feature
files (the demo world's). A feature step is the [CLS] embedding of the tower in a run
directory (`make demo`'s first stage) on its own input: `data.num_frames` frames
`data.frame_stride` apart around the step's centre (`window_frames`, clamped to the
video), normalized as in training.
"""
import jax
import numpy as np

from avtext import runs as runs_lib
from avtext.data import video as video_lib

def tower_from_run(workdir, step=None):
  """(apply_fn uint8 [B, F, H, W, 3] -> [B, D], frames per window, stride, dataset) of the
  run's checkpoint `step` (None: the latest; N; "best"); dataset: the run's
  config.dataset, what it trained on (e.g. the frame size and rate of its clips)."""
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

  return apply_fn, int(data.num_frames), int(data.frame_stride), run.config.dataset


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
