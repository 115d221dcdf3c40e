"""Tests for avtext.data.video against hand-worked values.

References: hand-computed index lists (VideoCC §4.1, §5.2, avideo. C); the frames
a crop keeps and the normalization by hand.
"""
import hypothesis
from hypothesis import strategies as st
import numpy as np
import pytest

from avtext.data import video

SETTINGS = hypothesis.settings(max_examples=30, deadline=None)


# --- temporal sampling --------------------------------------------------------


def test_sample_frame_indices_centred_by_hand():
  # span = 3 * 10 + 1 = 31 of 100 frames; starts 0..69, centre 69 // 2 = 34.
  np.testing.assert_array_equal(video.sample_frame_indices(100, 4, 10), [34, 44, 54, 64])
  assert video.sample_frame_indices(100, 4, 10).dtype == np.int32


def test_sample_frame_indices_random_start_covers_all_starts():
  rng = np.random.default_rng(0)
  starts = set()
  for _ in range(200):
    idx = video.sample_frame_indices(35, 4, 10, rng=rng)  # span 31: starts 0..4
    np.testing.assert_array_equal(np.diff(idx), [10, 10, 10])
    starts.add(int(idx[0]))
  assert starts == {0, 1, 2, 3, 4}


def test_videocc_clip_coverage():
  # §5.2 / Table 12: 32 frames at stride 14 at 25 fps cover ~18 s.
  idx = video.sample_frame_indices(25 * 60, 32, 14, rng=np.random.default_rng(1))
  assert (idx[-1] - idx[0] + 1) / 25 == pytest.approx(17.4)


def test_short_video_spreads_in_order():
  # Span 16 > 10 frames: linspace(0, 9, 4) = 0, 3, 6, 9.
  np.testing.assert_array_equal(video.sample_frame_indices(10, 4, 5), [0, 3, 6, 9])
  # Fewer frames than samples: linspace(0, 2, 5) = 0, .5, 1, 1.5, 2, rounded half up.
  np.testing.assert_array_equal(
      video.sample_frame_indices(3, 5, 2, rng=np.random.default_rng(0)), [0, 1, 1, 2, 2])


def test_test_clip_indices_by_hand():
  # Starts linspace(0, 100 - 31, 4) = 0, 23, 46, 69; the last clip ends on frame 99.
  expected = np.array([0, 23, 46, 69])[:, None] + 10 * np.arange(4)
  np.testing.assert_array_equal(video.test_clip_indices(100, 4, 10), expected)
  np.testing.assert_array_equal(video.test_clip_indices(100, 4, 10, num_clips=1),
                                [video.sample_frame_indices(100, 4, 10)])
  np.testing.assert_array_equal(video.test_clip_indices(10, 4, 5, num_clips=3),
                                [[0, 3, 6, 9]] * 3)


@SETTINGS
@hypothesis.given(num_frames=st.integers(1, 400), num_samples=st.integers(1, 40),
                  stride=st.integers(1, 20), num_clips=st.integers(1, 6),
                  seed=st.integers(0, 2**16))
def test_indices_in_range_and_ordered(num_frames, num_samples, stride, num_clips, seed):
  idx = video.sample_frame_indices(num_frames, num_samples, stride,
                                   rng=np.random.default_rng(seed))
  clips = video.test_clip_indices(num_frames, num_samples, stride, num_clips)
  assert clips.shape == (num_clips, num_samples)
  for row in [idx, *clips]:
    assert row.min() >= 0 and row.max() < num_frames
    assert np.all(np.diff(row) >= 0)
    if (num_samples - 1) * stride + 1 <= num_frames:
      assert np.all(np.diff(row) == stride)
  assert np.all(np.diff(clips[:, 0]) >= 0)


def test_sampling_rejects_bad_sizes():
  with pytest.raises(ValueError, match="num_frames"):
    video.sample_frame_indices(0, 4, 2)
  with pytest.raises(ValueError, match="stride"):
    video.test_clip_indices(10, 4, 0)

# --- RGB frames -----------------------------------------------------------------


def _normalized(x, mean=0.5, std=0.5):
  return (np.asarray(x, np.float64) / 255 - mean) / std


def test_identity_at_target_size_up_to_normalization():
  frames = np.random.default_rng(0).integers(0, 256, (3, 16, 16, 3), np.uint8)
  out = video.resize_crop_normalize(frames, size=16, train=False)
  assert out.dtype == np.float32 and out.shape == (3, 16, 16, 3)
  np.testing.assert_allclose(out, _normalized(frames), atol=1e-6)
  mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
  out = video.resize_crop_normalize(frames, size=16, train=False, mean=mean, std=std)
  np.testing.assert_allclose(out, _normalized(frames, np.array(mean), np.array(std)),
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("transpose", [False, True])
def test_centre_crop_keeps_the_middle(transpose):
  # Three 8x8 squares side by side (landscape) or stacked (portrait).
  frame = np.zeros((8, 24, 3), np.uint8)
  frame[:, 8:16] = 200
  frame[:, 16:] = 50
  if transpose:
    frame = frame.transpose(1, 0, 2).copy()
  out = video.resize_crop_normalize(frame[None], size=8, train=False)
  np.testing.assert_allclose(out, _normalized(np.full((1, 8, 8, 3), 200)), atol=1e-6)


def test_downscale_preserves_a_linear_ramp():
  # Bilinear resampling reproduces linear functions: halving a ramp 4x averages
  # columns 2j, 2j+1 -> 4 (2j + 0.5) away from the borders (uint8 rounding: +-1).
  ramp = np.broadcast_to((4 * np.arange(64))[None, None, :, None], (2, 64, 64, 3))
  out = video.resize_crop_normalize(ramp.astype(np.uint8), size=32, train=False,
                                    mean=(0, 0, 0), std=(1, 1, 1)) * 255
  np.testing.assert_allclose(out[:, :, 1:-1], np.broadcast_to(
      (8 * np.arange(1, 31) + 2)[None, None, :, None], (2, 32, 30, 3)), atol=1.01)


def test_train_crop_area_and_shared_box():
  ramp = np.broadcast_to((2 * np.arange(64))[None, None, :, None], (4, 64, 64, 3))
  frames = (ramp + 10 * np.arange(4)[:, None, None, None]).astype(np.uint8)
  rng = np.random.default_rng(3)
  for _ in range(10):
    # Area 1/4, square: a 32x32 window anywhere, upsampled to 64: the ramp
    # (2 levels per input pixel) spans ~31 input pixels.
    out = video.resize_crop_normalize(frames, size=64, train=True, rng=rng, mean=(0, 0, 0),
                                      std=(1, 1, 1), area_range=(0.25, 0.25),
                                      aspect_ratio_range=(1, 1)) * 255
    width = (out[0, 0, -1, 0] - out[0, 0, 0, 0]) / 2
    assert 29.5 <= width <= 32
    # Same box for every frame: frames differ only by their constant offsets.
    np.testing.assert_allclose(out - out[:1], np.broadcast_to(
        (10 * np.arange(4))[:, None, None, None], out.shape), atol=1e-3)


def test_flip_off_by_default_and_random_when_on():
  frames = np.zeros((1, 16, 16, 3), np.uint8)
  frames[:, :, :8] = 255  # bright left half: direction is visible
  full = dict(size=16, train=True, area_range=(1, 1), aspect_ratio_range=(1, 1))
  for seed in range(20):
    out = video.resize_crop_normalize(frames, rng=np.random.default_rng(seed), **full)
    np.testing.assert_allclose(out, _normalized(frames), atol=1e-6)
  flipped = 0
  for seed in range(20):
    out = video.resize_crop_normalize(frames, rng=np.random.default_rng(seed), flip=True, **full)
    is_flipped = np.allclose(out, _normalized(frames[:, :, ::-1]), atol=1e-6)
    assert is_flipped or np.allclose(out, _normalized(frames), atol=1e-6)
    flipped += is_flipped
  assert 0 < flipped < 20


def test_resize_crop_normalize_errors():
  with pytest.raises(ValueError, match="needs an rng"):
    video.resize_crop_normalize(np.zeros((1, 8, 8, 3), np.uint8), size=8, train=True)
  with pytest.raises(ValueError, match="uint8"):
    video.resize_crop_normalize(np.zeros((1, 8, 8, 3), np.float32), size=8, train=False)
