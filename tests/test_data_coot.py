"""COOT frame sampler and segment expansion (worked examples), the multi-scene world."""
import numpy as np
import pytest

from avtext.data import preprocessing
from avtext.data.synthetic import captions
from avtext.data.synthetic import multiscene
from avtext.data.synthetic import world


def test_eval_sampler_takes_bin_centres():
  # 10 -> 4: bins start at 0, 2.5, 5, 7.5; centres + 1.25 -> floor 1, 3, 6, 8.
  np.testing.assert_array_equal(preprocessing.coot_frame_indices(10, 4, None), [1, 3, 6, 8])
  np.testing.assert_array_equal(preprocessing.coot_frame_indices(5, 5, None), [0, 1, 2, 3, 4])
  np.testing.assert_array_equal(preprocessing.coot_frame_indices(7, 1, None), [3])


def test_train_sampler_is_one_point_per_shuffled_bin():
  # 10 -> 4: starts round-half-down(0, 2.5, 5, 7.5) = 0, 2, 5, 7 -> sizes 2, 3, 2, last 3.
  # Whatever the shuffle, the bins tile [0, 10) with sizes {2, 3, 2, 3} in some order.
  for seed in range(20):
    idx = preprocessing.coot_frame_indices(10, 4, np.random.default_rng(seed))
    assert np.all(np.diff(idx) > 0) and idx[0] >= 0 and idx[-1] <= 9
  # A reference written from the official algorithm with the same generator.
  def reference(n, m, rng):
    starts = np.ceil(np.linspace(0, n, m, endpoint=False) - 0.5).astype(int)
    off = starts[1:] - starts[:-1]
    rng.shuffle(off)
    off = np.concatenate([off, [n - off.sum()]])
    new = np.cumsum(off) - off[0]
    return np.floor(new + np.roll(off, -1) * rng.random(m)).astype(int)
  for n, m in ((10, 4), (80, 80), (123, 80), (11, 3)):
    np.testing.assert_array_equal(
        preprocessing.coot_frame_indices(n, m, np.random.default_rng(n)),
        reference(n, m, np.random.default_rng(n)))


@pytest.mark.parametrize("args,expected", [
    ((20, 10, 0, 3), (0, 10, True)),      # at the start: grows right only
    ((20, 10, 18, 20), (10, 20, True)),   # at the end: grows left only
    ((20, 10, 8, 10), (4, 14, True)),     # middle: left, right, left, ...
    ((5, 10, 1, 2), (0, 5, True)),        # video shorter than the minimum
    ((20, 10, 2, 15), (2, 15, False)),    # long enough already
])
def test_expand_segment_worked_examples(args, expected):
  assert preprocessing.expand_segment(*args) == expected


def test_multiscene_video_renders_by_owning_scene():
  spec = world.WorldSpec(height=32, width=32)
  source = multiscene.MultiSceneSource("val", num_examples=5, spec=spec)
  d = source.describe(2)
  video = source.video(2)
  bounds = video.boundaries
  assert 3 <= len(d["segments"]) <= 8 and bounds[0] == 0 and np.all(np.diff(bounds) >= 2.0 - 1e-9)
  for a, b in zip(video.scenes, video.scenes[1:]):
    assert a.attributes() != b.attributes()
  for seg in d["segments"]:
    assert captions.caption_fits(seg["mentioned"], seg["attributes"])
  k = 1
  first = int(round(bounds[k] * spec.fps))  # the first frame of scene k
  np.testing.assert_array_equal(source.render_frames(2, [first, first - 1]), np.concatenate([
      world.render_frames(video.scenes[k], [0.0], spec),
      world.render_frames(video.scenes[k - 1], [(first - 1) / spec.fps - bounds[k - 1]], spec)]))
  full = source.render_audio(2)
  np.testing.assert_array_equal(source.render_audio(2, 12345, 40000), full[12345:52345])
  # Random access: example 2 alone equals example 2 after others; splits differ.
  other = multiscene.MultiSceneSource("val", num_examples=5, spec=spec)
  assert other.describe(2) == d
  assert multiscene.MultiSceneSource("test", num_examples=5, spec=spec).describe(2) != d


def test_feature_windows_are_centred_and_clamped():
  from avtext.tools import coot_synthetic
  w = coot_synthetic.window_frames(num_frames=100, fps=25, feature_fps=2, frames_per_window=4,
                                   stride=8)
  # 4 s -> 8 steps centred at 0.25 s + 0.5 s k = frame 6.25 -> 6, 19 (round half even), ...
  assert w.shape == (8, 4)
  np.testing.assert_array_equal(w[0], [0, 2, 10, 18])  # 6 - 12 clamped to 0
  np.testing.assert_array_equal(w[1], [7, 15, 23, 31])  # centre round(18.75) = 19
  assert w.max() == 99
