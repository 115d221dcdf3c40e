"""The demo world's video encoder: clip features of its long videos from a trained RGB
tower (`avtext.features.tower`), the stand-in for I3D / ResNet that the COOT and TVR / TVC
writers (`coot_layout`, `tvr_layout`, `avworld.tools`) are given.
"""
import functools

import numpy as np
from tqdm import tqdm

from avtext.features import tower

FRAME_FIELDS = ("height", "width", "fps")  # of the world a tower was trained on


def extract_video_features(source, indices, *, apply_fn, frames_per_window: int,
                           frame_stride: int, feature_fps: float, batch_size: int = 256,
                           num_steps=None) -> dict[str, np.ndarray]:
  """{video_id: float32 [T, D]} for `indices` of a `MultiSceneSource` (see the module doc).

  num_steps: None (whole steps) or `index -> T` (e.g. TVR's ceil(duration / 1.5)).
  """
  jobs = []  # (video id, step, frame indices)
  for i in indices:
    windows = tower.window_frames(source.num_frames(i), source.spec.fps, feature_fps,
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
  """(video_features, frames) of the run's tower: the encoder the world's writers take,
  and the frame height, width and fps of the world the run trained on ({} when its
  config names none: the world's defaults).

  video_features(source, indices, *, feature_fps, num_steps=None) is
  `extract_video_features` with the tower's apply_fn, window and stride.
  """
  apply_fn, frames_per_window, stride, dataset = tower.tower_from_run(workdir, step)
  world_cfg = dataset.get("world")
  frames = {k: world_cfg[k] for k in FRAME_FIELDS} if world_cfg else {}
  return functools.partial(extract_video_features, apply_fn=apply_fn,
                           frames_per_window=frames_per_window, frame_stride=stride), frames
