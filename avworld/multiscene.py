"""Multi-scene videos: the one generator behind every longer-video variant.

A `MultiSceneVideo` is a sequence of world scenes (`world.Scene`) cut
together with hard cuts at `boundaries` (seconds, from 0 to the duration).
Any frame or audio sample is rendered alone, by its scene at scene-local time,
and equals the same frame / sample of a full rendering bit for bit (as in
`world`). Variants build on it:

  COOT paragraph videos (here, `MultiSceneSource`): one sentence per scene,
      the paragraph is the scenes' sentences in order;
  TVR / TVC long videos (`longvideo.LongVideoSource`): the same videos plus
      a subtitle stream and moments whose start/end are scene boundaries, each
      with descriptions of type video / sub / video+sub;
  spoken captions / mining corpora: any text or audio derived per scene.

Draw order per example (random access: example i depends only on (seed,
split, i)): rng.visual draws the scene count, then the durations, then each
scene's visuals; rng.audio each scene's sound; rng.text the sentences.
Successive scenes always differ in their ground-truth attributes (a scene
equal to the previous one is drawn again, up to 32 times), so every
segment's sentence can be told apart from its neighbours'.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from avworld import captions
from avworld import world

DEFAULT_SPLIT_SIZES = {'train': 20_000, 'val': 1000, 'test': 1000}


@dataclasses.dataclass(frozen=True)
class MultiSceneVideo:
  scenes: tuple[world.Scene, ...]
  boundaries: tuple[float, ...]  # len(scenes) + 1 times in seconds, boundaries[0] = 0

  @property
  def duration_s(self) -> float:
    return self.boundaries[-1]

  def scene_at(self, times_s: np.ndarray) -> np.ndarray:
    """Index of the scene whose [start, stop) holds each time (the last one holds its stop)."""
    idx = np.searchsorted(np.asarray(self.boundaries), np.asarray(times_s), side='right') - 1
    return np.clip(idx, 0, len(self.scenes) - 1)


def sample_multiscene_video(rng: world.ExampleRng, spec: world.WorldSpec, *,
                            num_scenes: tuple[int, int] = (3, 8),
                            scene_duration_s: tuple[float, float] = (2.0, 4.0),
                            scene_fn: Callable[[world.ExampleRng, world.WorldSpec],
                                               world.Scene] | None = None
                            ) -> MultiSceneVideo:
  """Scene count in [lo, hi], durations uniform in the range (whole frames).

  `scene_fn(rng, spec)` draws each scene (default `world.sample_scene` on
  rng.visual / rng.audio); the mining corpus (`synthetic.mining`) passes one that
  sometimes shows a seed image's content.
  """
  lo, hi = num_scenes
  if not 1 <= lo <= hi:
    raise ValueError(f'num_scenes must be 1 <= lo <= hi, got {num_scenes}')
  n = int(rng.visual.integers(lo, hi + 1))
  frames = np.round(rng.visual.uniform(*scene_duration_s, size=n) * spec.fps)
  durations = np.maximum(frames, 1) / spec.fps
  scenes: list[world.Scene] = []
  for _ in range(n):
    for _ in range(32):
      scene = (scene_fn(rng, spec) if scene_fn is not None
               else world.sample_scene(rng.visual, rng.audio, spec))
      if not scenes or scene.attributes() != scenes[-1].attributes():
        break
    scenes.append(scene)
  boundaries = tuple(float(b) for b in np.concatenate([[0.0], np.cumsum(durations)]))
  return MultiSceneVideo(tuple(scenes), boundaries)


def render_frames(video: MultiSceneVideo, times_s: Sequence[float] | np.ndarray,
                  spec: world.WorldSpec) -> np.ndarray:
  """uint8 [len(times), H, W, 3]: each time by its scene at time - scene start."""
  times = np.asarray(times_s, np.float64).reshape(-1)
  out = np.zeros((len(times), spec.height, spec.width, 3), np.uint8)
  owner = video.scene_at(times)
  for k in np.unique(owner):
    rows = owner == k
    out[rows] = world.render_frames(video.scenes[k], times[rows] - video.boundaries[k], spec)
  return out


def render_audio(video: MultiSceneVideo, start_sample: int, num_samples: int,
                 spec: world.WorldSpec) -> np.ndarray:
  """float32 [num_samples]: each scene's sound over its own interval, scene-local."""
  edges = np.round(np.asarray(video.boundaries) * spec.sample_rate).astype(np.int64)
  out = np.zeros(num_samples, np.float32)
  stop = start_sample + num_samples
  for k, scene in enumerate(video.scenes):
    a, b = max(start_sample, edges[k]), min(stop, edges[k + 1])
    if a < b:
      out[a - start_sample:b - start_sample] = world.render_audio(scene, int(a - edges[k]),
                                                                  int(b - a), spec)
  return out


class MultiSceneSource:
  """Paragraph videos of 3-8 scenes (grain random-access protocol); COOT's synthetic data.

  Subclasses (`longvideo.LongVideoSource`) keep the video and the rendering
  and override `_annotate` (the text drawn per video) and `describe`.
  """
  STREAM = 'multiscene'

  def __init__(self, split: str, *, seed: int = 0, num_examples: int | None = None,
               spec: world.WorldSpec = world.WorldSpec(),
               num_scenes: tuple[int, int] = (3, 8),
               scene_duration_s: tuple[float, float] = (2.0, 4.0)):
    if split not in DEFAULT_SPLIT_SIZES:
      raise ValueError(f'MultiSceneSource: unknown split {split!r}; expected one of '
                       f'{sorted(DEFAULT_SPLIT_SIZES)}')
    self.split, self.seed, self.spec = split, seed, spec
    self.num_scenes, self.scene_duration_s = tuple(num_scenes), tuple(scene_duration_s)
    self.num_examples = DEFAULT_SPLIT_SIZES[split] if num_examples is None else num_examples
    self._stream = f'{self.STREAM}/{split}'
    self._last: tuple[int, Any] | None = None

  def __len__(self) -> int:
    return self.num_examples

  def __repr__(self) -> str:
    return (f'MultiSceneSource(split={self.split!r}, seed={self.seed}, '
            f'num_examples={self.num_examples})')

  def _sample(self, index: int):
    i = int(index)
    if not 0 <= i < self.num_examples:
      raise IndexError(f'{self!r}: index {index} out of range [0, {self.num_examples})')
    last = self._last
    if last is not None and last[0] == i:
      return last[1]
    rng = world.example_rng(self.seed, self._stream, i)
    video = sample_multiscene_video(rng, self.spec, num_scenes=self.num_scenes,
                                    scene_duration_s=self.scene_duration_s)
    sample = (video, self._annotate(rng, video))
    self._last = (i, sample)
    return sample

  def _annotate(self, rng: world.ExampleRng, video: MultiSceneVideo) -> Any:
    """The text of a video (drawn from rng.text after the video): one sentence per scene."""
    sentences = []
    for scene in video.scenes:
      mention = captions.sample_mention(rng.text, scene.attributes())
      text, _ = captions.render_caption(rng.text, mention)
      sentences.append((text, mention))
    return sentences

  def video(self, index: int) -> MultiSceneVideo:
    return self._sample(index)[0]

  def video_id(self, index: int) -> str:
    return f'{self.STREAM}-{self.split}-s{self.seed}-{int(index):07d}'

  def num_frames(self, index: int) -> int:
    return int(round(self.video(index).duration_s * self.spec.fps))

  def describe(self, index: int) -> dict[str, Any]:
    """Everything but pixels and samples (no rendering)."""
    video, sentences = self._sample(index)
    segments = [{'start_s': video.boundaries[k], 'stop_s': video.boundaries[k + 1],
                 'sentence': text, 'attributes': scene.attributes(),
                 'mentioned': copy.deepcopy(mention)}
                for k, (scene, (text, mention)) in enumerate(zip(video.scenes, sentences))]
    return {'video_id': self.video_id(index), 'duration_s': video.duration_s,
            'num_frames': self.num_frames(index), 'segments': segments,
            'paragraph': [s['sentence'] for s in segments]}

  def render_frames(self, index: int, frame_indices: Sequence[int] | np.ndarray) -> np.ndarray:
    idx = np.asarray(frame_indices, np.int64).reshape(-1)
    n = self.num_frames(index)
    if idx.size and (idx.min() < 0 or idx.max() >= n):
      raise IndexError(f'{self!r}: frame indices of video {index} must be in [0, {n}), got '
                       f'{idx.min()}..{idx.max()}')
    return render_frames(self.video(index), self.spec.frame_times(idx), self.spec)

  def render_audio(self, index: int, start_sample: int = 0,
                   num_samples: int | None = None) -> np.ndarray:
    total = int(round(self.video(index).duration_s * self.spec.sample_rate))
    stop = total if num_samples is None else min(total, start_sample + num_samples)
    return render_audio(self.video(index), start_sample, max(0, stop - start_sample), self.spec)
