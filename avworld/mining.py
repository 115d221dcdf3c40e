"""The synthetic mining world: seed images with captions and a corpus of long videos.

The stand-in for VideoCC's inputs (§3.1): CC3M's image-caption pairs (the
*seeds*) and a corpus of online videos to mine. Both come from the world
(`world`) and the one multi-scene generator (`multiscene`), from their own
random streams, so no seed is a corpus frame.

Seeds (stream 'mining/seeds'): seed i is a scene and one frame of it at a
random time in [0, 2) s, the *image*; its caption is `captions.sample_mention`
rendered by `captions.render_caption`, and, like CC3M's alt-text, it describes
what the image shows: the objects' shapes and colours, their count and the
background (`STILL_FIELDS`). It states no sound (an image's caption cannot say
what is heard) and, for the same reason, no motion: a still frame shows no
motion (`world.render_frames` draws no motion cue in a frame). The option
`seed_caption_motion=True` (`avworld.tools.mining_world --seed_caption_motion`)
restores the earlier captions, which may also state the objects' motion (70 %
of them do), for comparison: no image-only embedder can rank a still by a motion,
so they cap any f's precision. The option changes the captions only (the
'mining/seeds' text stream); the seed scenes, images and the corpus are the same.

Corpus (stream 'mining/corpus'): video i is a `multiscene` video of
`num_scenes` scenes of `scene_seconds` each (default 8-12 scenes of 8-12 s:
64-144 s, so every video is at least 60 s). Each scene, with probability
`seed_scene_rate`, shows the content of a random seed among the first
`num_seeds`: the seed scene's objects (shape, colour, motion) and background
kind, with fresh positions, sizes, speeds and background parameters, and a fresh
sound; otherwise it is a random scene. So a seed's content is sometimes in the
corpus and sometimes not, and random scenes also fit some captions, as real
videos show what some captions say without being made for them.

Ground truth: `frame_fits(video, time, seed)` is `captions.caption_fits` of
the seed's mention against the scene shown at that time; a mined clip is
*precise* when some frame in it fits (the paper's manual check, app. A.3: "at
least one frame in the clip matching the caption").

Everything is random access: seed i and video i depend only on (seed, stream, i,
spec).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from avworld import captions
from avworld import multiscene
from avworld import world

SEED_STREAM = 'mining/seeds'
CORPUS_STREAM = 'mining/corpus'
# The object fields a seed caption may state: what a still frame shows.
STILL_FIELDS = ('shape', 'colour')


@dataclasses.dataclass(frozen=True)
class MiningWorld:
  """The seed set and the corpus (module docstring)."""
  num_seeds: int = 1000
  num_videos: int = 100
  seed_scene_rate: float = 0.3
  num_scenes: tuple[int, int] = (8, 12)
  scene_seconds: tuple[float, float] = (8.0, 12.0)
  seed: int = 0
  spec: world.WorldSpec = world.WorldSpec(duration_s=10.0)
  seed_caption_motion: bool = False  # True: seed captions may state motion (the old world)

  def __post_init__(self):
    if self.num_seeds < 1 or self.num_videos < 1:
      raise ValueError(f'MiningWorld: num_seeds and num_videos must be >= 1, got '
                       f'{self.num_seeds}, {self.num_videos}')
    if not 0.0 <= self.seed_scene_rate <= 1.0:
      raise ValueError(f'MiningWorld: seed_scene_rate must be in [0, 1], got '
                       f'{self.seed_scene_rate}')

  # ------------------------------------------------------------------ seeds
  def _seed(self, index: int) -> tuple[world.Scene, float, dict[str, Any], str]:
    i = int(index)
    if not 0 <= i < self.num_seeds:
      raise IndexError(f'seed {index} out of range [0, {self.num_seeds})')
    rng = world.example_rng(self.seed, SEED_STREAM, i)
    scene = world.sample_scene(rng.visual, rng.audio, self.spec)
    time_s = float(np.floor(rng.visual.uniform(0.0, 2.0) * self.spec.fps) / self.spec.fps)
    mention = captions.sample_mention(
        rng.text, scene.attributes(), sound_rate=0.0,
        object_fields=world.OBJECT_FIELDS if self.seed_caption_motion else STILL_FIELDS)
    text, _ = captions.render_caption(rng.text, mention)
    return scene, time_s, mention, text

  def seed_id(self, index: int) -> str:
    return f'seed-s{self.seed}-{int(index):07d}'

  def seed_caption(self, index: int) -> str:
    return self._seed(index)[3]

  def seed_mention(self, index: int) -> dict[str, Any]:
    return self._seed(index)[2]

  def seed_image(self, index: int) -> np.ndarray:
    """uint8 [H, W, 3]: the seed scene at its image time."""
    scene, time_s, _, _ = self._seed(index)
    return world.render_frames(scene, [time_s], self.spec)[0]

  # ------------------------------------------------------------------ corpus
  def _seed_like_scene(self, rng: world.ExampleRng, seed_scene: world.Scene) -> world.Scene:
    """The seed scene's objects and background kind, everything else drawn afresh."""
    fresh = world.sample_scene(rng.visual, rng.audio, self.spec)
    side = min(self.spec.height, self.spec.width)
    objects = []
    for obj in seed_scene.objects:
      size = float(rng.visual.uniform(*self.spec.object_size) * side)
      r = size / 2
      extent = self.spec.height if obj.motion in ('up', 'down') else self.spec.width
      speed = 0.0 if obj.motion == 'still' else float(
          rng.visual.uniform(*self.spec.object_speed) * extent)
      objects.append(dataclasses.replace(
          obj, size=size, x0=float(rng.visual.uniform(r, self.spec.width - r)),
          y0=float(rng.visual.uniform(r, self.spec.height - r)), speed=speed))
    background = dataclasses.replace(fresh.background, kind=seed_scene.background.kind)
    return world.Scene(tuple(objects), background, fresh.sound)

  def _video(self, index: int) -> tuple[multiscene.MultiSceneVideo, tuple[int, ...]]:
    return _cached_video(self, int(index))

  def _draw_video(self, index: int) -> tuple[multiscene.MultiSceneVideo, tuple[int, ...]]:
    i = int(index)
    if not 0 <= i < self.num_videos:
      raise IndexError(f'video {index} out of range [0, {self.num_videos})')
    rng = world.example_rng(self.seed, CORPUS_STREAM, i)
    drawn: dict[int, tuple[world.Scene, int]] = {}  # id(scene) -> (scene, planted seed)

    def scene_fn(r: world.ExampleRng, spec: world.WorldSpec) -> world.Scene:
      del spec
      k = -1
      if r.visual.random() < self.seed_scene_rate:
        k = int(r.visual.integers(self.num_seeds))
        scene = self._seed_like_scene(r, self._seed(k)[0])
      else:
        scene = world.sample_scene(r.visual, r.audio, self.spec)
      drawn[id(scene)] = (scene, k)
      return scene

    video = multiscene.sample_multiscene_video(
        rng, self.spec, num_scenes=self.num_scenes, scene_duration_s=self.scene_seconds,
        scene_fn=scene_fn)
    return video, tuple(drawn[id(s)][1] for s in video.scenes)

  def video(self, index: int) -> multiscene.MultiSceneVideo:
    return self._video(index)[0]

  def video_id(self, index: int) -> str:
    return f'corpus-s{self.seed}-{int(index):06d}'

  def describe_video(self, index: int) -> dict[str, Any]:
    """Scenes (start, stop, attributes, the seed whose content it shows or -1) of video
    `index`; no rendering."""
    video, planted = self._video(index)
    return {'video_id': self.video_id(index), 'duration_s': video.duration_s,
            'scenes': [{'start_s': video.boundaries[k], 'stop_s': video.boundaries[k + 1],
                        'attributes': s.attributes(), 'seed': planted[k]}
                       for k, s in enumerate(video.scenes)]}

  def render_frames(self, index: int, times_s) -> np.ndarray:
    return multiscene.render_frames(self.video(index), times_s, self.spec)

  def render_audio(self, index: int, start_sample: int = 0,
                   num_samples: int | None = None) -> np.ndarray:
    video = self.video(index)
    total = int(round(video.duration_s * self.spec.sample_rate))
    stop = total if num_samples is None else min(total, start_sample + num_samples)
    return multiscene.render_audio(video, start_sample, max(0, stop - start_sample), self.spec)

  # ------------------------------------------------------------------ truth
  def frame_fits(self, index: int, times_s, seed_index: int) -> np.ndarray:
    """bool [len(times)]: does seed `seed_index`'s caption fit the frame at each time?"""
    video = self.video(index)
    mention = self.seed_mention(seed_index)
    fits = [captions.caption_fits(mention, s.attributes()) for s in video.scenes]
    return np.asarray(fits, bool)[video.scene_at(np.asarray(times_s, np.float64))]

  def clip_fits(self, index: int, start_s: float, end_s: float, seed_index: int) -> bool:
    """Does some frame of [start_s, end_s) fit the seed's caption (app. A.3)?"""
    return scenes_fit(self.video(index), self.seed_mention(seed_index), start_s, end_s)


def scenes_fit(video: multiscene.MultiSceneVideo, mention: dict[str, Any], start_s: float,
               end_s: float) -> bool:
  """Does a scene overlapping [start_s, end_s) fit the caption's mention?"""
  for k, scene in enumerate(video.scenes):
    if video.boundaries[k] < end_s and video.boundaries[k + 1] > start_s and \
        captions.caption_fits(mention, scene.attributes()):
      return True
  return False


@functools.lru_cache(maxsize=16)
def _cached_video(mining_world: MiningWorld, index: int):
  return mining_world._draw_video(index)  # pylint: disable=protected-access
