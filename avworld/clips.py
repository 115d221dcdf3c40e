"""Clip-caption variant of the synthetic world: one scene, one caption.

`ClipCaptionSource` is a grain random-access data source; example i of a
split is a pure function of (split, seed, i, spec). It stands in for
clip-caption datasets (VideoCC, MSR-VTT, S-MiT) in demos and tests, and
`oracle_recall_at_1` says how well any model could possibly retrieve on it.
"""
from __future__ import annotations

import copy
from typing import Any, Sequence

import numpy as np

from avworld import captions
from avworld import truth
from avworld import world

DEFAULT_SPLIT_SIZES = {'train': 100_000, 'val': 1000, 'test': 1000}


class ClipCaptionSource:
  """Synthetic clips with captions; grain `RandomAccessDataSource` protocol.

  Splits draw from disjoint random streams ('clips/<split>'), so no clip is
  shared between train, val and test; attribute combinations do recur, as
  they must for generalization to be possible. Its `ground_truth` is the world's
  (`truth.WORLD`, `avtext.data.ground_truth.ClipTruth`).
  """

  ground_truth = truth.WORLD

  def __init__(self, split: str, *, seed: int = 0,
               num_examples: int | None = None,
               spec: world.WorldSpec = world.WorldSpec()):
    if split not in DEFAULT_SPLIT_SIZES:
      raise ValueError(f'ClipCaptionSource: unknown split {split!r}; expected '
                       f'one of {sorted(DEFAULT_SPLIT_SIZES)}')
    if num_examples is not None and num_examples < 1:
      raise ValueError(f'ClipCaptionSource: num_examples must be >= 1, got '
                       f'{num_examples}')
    self.split = split
    self.seed = seed
    self.spec = spec
    self.num_examples = (DEFAULT_SPLIT_SIZES[split] if num_examples is None
                         else num_examples)
    self._stream = f'clips/{split}'
    self._num_fitting: np.ndarray | None = None  # cache of the oracle counts
    self._attributes: list[dict[str, Any]] | None = None  # and of their inputs
    # The last sampled example, so describe() + render_frames() +
    # render_audio() of one index sample it once.
    self._last: tuple[int, Any] | None = None

  def __len__(self) -> int:
    return self.num_examples

  def __repr__(self) -> str:
    return (f'ClipCaptionSource(split={self.split!r}, seed={self.seed}, '
            f'num_examples={self.num_examples}, spec={self.spec})')

  def _index(self, index: int) -> int:
    i = int(index)
    if not 0 <= i < self.num_examples:
      raise IndexError(f'{self!r}: index {index} out of range '
                       f'[0, {self.num_examples})')
    return i

  def _sample(self, index: int) -> tuple[world.Scene, dict[str, Any], str,
                                         int]:
    i = self._index(index)
    last = self._last  # one read: safe if grain threads share the source
    if last is not None and last[0] == i:
      return last[1]
    rng = world.example_rng(self.seed, self._stream, i)
    scene = world.sample_scene(rng.visual, rng.audio, self.spec)
    mention = captions.sample_mention(rng.text, scene.attributes())
    text, template = captions.render_caption(rng.text, mention)
    sampled = (scene, mention, text, template)
    self._last = (i, sampled)
    return sampled

  def scene(self, index: int) -> world.Scene:
    """The full scene (ground truth and nuisance parameters) of a clip."""
    return self._sample(index)[0]

  def clip_id(self, index: int) -> str:
    return f'clips-{self.split}-s{self.seed}-{self._index(index):07d}'

  def describe(self, index: int) -> dict[str, Any]:
    """Everything but the pixels and samples (no rendering; ~0.1 ms)."""
    scene, mention, text, template = self._sample(index)
    attributes = scene.attributes()
    # A copy, so a caller editing the example cannot change the cached one.
    attributes.update(mentioned=copy.deepcopy(mention), template=template,
                      nuisance=scene.nuisance())
    return {
        'caption': text,
        'attributes': attributes,
        'clip_id': self.clip_id(index),
        'mentions_sound': 'sound' in mention,
        'has_audio': True,
        'num_frames': self.spec.num_frames,
        'num_samples': self.spec.num_samples,
    }

  def render_frames(self, index: int,
                    frame_indices: Sequence[int] | np.ndarray) -> np.ndarray:
    """uint8 [len(frame_indices), H, W, 3], equal to frames[frame_indices]."""
    idx = np.asarray(frame_indices, dtype=np.int64).reshape(-1)
    if idx.size and (idx.min() < 0 or idx.max() >= self.spec.num_frames):
      raise IndexError(f'{self!r}: frame indices must be in '
                       f'[0, {self.spec.num_frames}), got {idx.min()}.'
                       f'.{idx.max()}')
    return world.render_frames(self.scene(index), self.spec.frame_times(idx),
                               self.spec)

  def render_audio(self, index: int, start_sample: int = 0,
                   num_samples: int | None = None) -> np.ndarray:
    """float32 [num_samples], equal to audio[start:start + num_samples].

    Like slicing, the result is cut at the clip's end.
    """
    total = self.spec.num_samples
    if not 0 <= start_sample <= total:
      raise IndexError(f'{self!r}: start_sample {start_sample} outside '
                       f'[0, {total}]')
    stop = total if num_samples is None else min(total,
                                                 start_sample + num_samples)
    return world.render_audio(self.scene(index), start_sample,
                              max(0, stop - start_sample), self.spec)

  def __getitem__(self, index: int) -> dict[str, Any]:
    """The full example: every frame and the whole waveform."""
    example = self.describe(index)
    for key in ('num_frames', 'num_samples'):
      del example[key]
    scene = self.scene(index)
    example['frames'] = world.render_frames(
        scene, self.spec.frame_times(np.arange(self.spec.num_frames)),
        self.spec)
    example['audio'] = world.render_audio(scene, 0, self.spec.num_samples,
                                          self.spec)
    return example

  def _all_attributes(self) -> list[dict[str, Any]]:
    """Every clip's attributes (`describe(i)['attributes']`, sampled once: the oracles
    read them again for each subset). The clip's own: a subclass's extra fields (its
    speech) are not sampled."""
    if self._attributes is None:
      self._attributes = [ClipCaptionSource.describe(self, i)['attributes']
                          for i in range(len(self))]
    return self._attributes

  def num_fitting_clips(self) -> np.ndarray:
    """int [len(self)]: clips of this split that fit caption i (>= 1)."""
    if self._num_fitting is None:
      described = self._all_attributes()
      self._num_fitting = captions.num_fitting_clips(
          [a['mentioned'] for a in described], described)
    return self._num_fitting

  def oracle_recall_at_1(self, subset: Sequence[int] | np.ndarray | None = None, *,
                         gallery_is_subset: bool = False) -> float:
    """Best text-to-video R@1 (%) on this split (gallery = the whole split).

    `subset` restricts the captions averaged over (e.g. those mentioning the
    sound) while the gallery stays the whole split; with `gallery_is_subset`
    the gallery is the subset too (S-MiT's 1k-pair subsets).
    """
    if gallery_is_subset and subset is not None:
      attributes = self._all_attributes()
      described = [attributes[int(i)] for i in subset]
      return captions.oracle_recall_at_1(captions.num_fitting_clips(
          [a['mentioned'] for a in described], described))
    n = self.num_fitting_clips()
    return captions.oracle_recall_at_1(n if subset is None else n[
        np.asarray(subset, dtype=np.int64)])

  def query_groups(self, num_queries: int) -> dict[str, tuple[str, np.ndarray]]:
    """The captions (of the first `num_queries`) that state the clip's sound, which the
    retrieval evaluator scores apart (`avtext.data.ground_truth.RetrievalOracle`)."""
    sound = np.flatnonzero([self.describe(i)['mentions_sound'] for i in range(num_queries)])
    return {'sound': ('sound-mentioning captions', sound)}


def oracle_recall_at_1(split: str, *, seed: int = 0,
                       num_examples: int | None = None,
                       spec: world.WorldSpec = world.WorldSpec()) -> float:
  """Oracle text-to-video R@1 (%) of a split (`captions.oracle_recall_at_1`)."""
  return ClipCaptionSource(split, seed=seed, num_examples=num_examples,
                           spec=spec).oracle_recall_at_1()
