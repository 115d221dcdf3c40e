"""Tests for avtext.data.audio against hand-worked values and references.

References: hand-computed index lists (VideoCC aaudio. C); TF's tf.signal.stft +
tf.signal.linear_to_mel_weight_matrix for the log-mel front end; physical
facts (a sine's energy lands in its mel band, silence gives the log floor,
magnitudes scale linearly).
"""
import math

import hypothesis
from hypothesis import strategies as st
import numpy as np
import pytest

from avtext.data import audio

LOG_FLOOR = math.log(1e-6)


# --- audio aligned with the frames ----------------------------------------------


def test_audio_window_for_frames_by_hand():
  frames = np.arange(25, 50)  # 1 s of 25 fps video: [1 s, 2 s)
  assert audio.audio_window_for_frames(frames, 25, 16000) == (16000, 32000)
  assert audio.audio_window_for_frames(frames, 25, 100) == (100, 200)
  # 24 s of log-mel frames centred on 1.5 s reaches before the recording.
  assert audio.audio_window_for_frames(frames, 25, 100, 2400) == (-1050, 1350)
  # 32 frames at stride 14 from frame 100 (last 534): [4 s, 21.4 s), centre 12.7 s.
  clip = 100 + 14 * np.arange(32)
  assert audio.audio_window_for_frames(clip, 25, 100, 2200) == (170, 2370)


def _frame_numbered_spec(num_frames, bins=3):
  return np.repeat(np.arange(num_frames, dtype=np.float32)[:, None], bins, axis=1)


def test_spectrogram_segments_videocc_by_hand():
  # aaudio. C: 8 x 100 frames, 300 apart; span 2200 of 3000 frames, centred at 400.
  out = audio.sample_spectrogram_segments(_frame_numbered_spec(3000))
  assert out.shape == (800, 3)
  expected = (400 + 300 * np.arange(8)[:, None] + np.arange(100)).reshape(-1)
  np.testing.assert_array_equal(out[:, 0], expected)
  clamped_low = audio.sample_spectrogram_segments(_frame_numbered_spec(3000), start=-50)
  assert clamped_low[0, 0] == 0 and clamped_low[-1, 0] == 2199
  clamped_high = audio.sample_spectrogram_segments(_frame_numbered_spec(3000), start=10**6)
  assert clamped_high[0, 0] == 800 and clamped_high[-1, 0] == 2999


def test_spectrogram_segments_short_audio():
  # 1000 < 2200 frames: starts spread over 0..900 = 900 * k / 7, rounded.
  out = audio.sample_spectrogram_segments(_frame_numbered_spec(1000), start=123)
  np.testing.assert_array_equal(out[::100, 0], [0, 129, 257, 386, 514, 643, 771, 900])
  # Shorter than one segment: padded with the silence floor, all segments equal.
  out = audio.sample_spectrogram_segments(_frame_numbered_spec(50), num_segments=2)
  np.testing.assert_array_equal(out[:50, 0], np.arange(50))
  np.testing.assert_allclose(out[50:100], LOG_FLOOR)
  np.testing.assert_array_equal(out[:100], out[100:])


# --- audio ----------------------------------------------------------------------


def _tf_log_mel(wave, sample_rate=16000):
  """Independent reference: the DMVR/MBT front end built from tf.signal."""
  tf = pytest.importorskip("tensorflow")
  stft = tf.signal.stft(tf.constant(wave, tf.float32), frame_length=400, frame_step=160,
                        fft_length=512, window_fn=tf.signal.hamming_window, pad_end=True)
  weights = tf.signal.linear_to_mel_weight_matrix(128, 257, sample_rate, 80.0, 7600.0)
  return np.log(tf.tensordot(tf.abs(stft), weights, 1).numpy() + 1e-6), weights.numpy()


def test_log_mel_matches_tf_signal():
  rng = np.random.default_rng(0)
  t = np.arange(19700) / 16000  # 1.23 s: the last of ceil(19700 / 160) = 124 frames is partial
  wave = (0.3 * np.sin(2 * np.pi * (200 + 1500 * t) * t) + 0.05 * rng.standard_normal(len(t)))
  wave = wave.astype(np.float32)
  ref, ref_weights = _tf_log_mel(wave)
  # TF builds the matrix in float32, we in float64: agree to float32 rounding.
  np.testing.assert_allclose(audio.mel_weight_matrix(128, 512, 16000.0, 80.0, 7600.0),
                             ref_weights, atol=3e-5)
  ours = audio.log_mel_spectrogram(wave)
  assert ours.shape == ref.shape == (124, 128) and ours.dtype == np.float32
  np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4)


def _mel(hz):
  return 2595 * np.log10(1 + np.asarray(hz) / 700)  # HTK, as the TF docs write it


@pytest.mark.parametrize("freq", [1000.0, 3000.0])
def test_sine_peaks_in_its_mel_band(freq):
  wave = 0.5 * np.sin(2 * np.pi * freq * np.arange(16000) / 16000)
  spec = audio.log_mel_spectrogram(wave)
  centres = np.linspace(_mel(80), _mel(7600), 130)[1:-1]
  assert spec.shape == (100, 128)
  assert spec.mean(axis=0).argmax() == np.abs(centres - _mel(freq)).argmin()


def test_framing_silence_and_linearity():
  assert audio.log_mel_spectrogram(np.zeros(16000)).shape == (100, 128)
  assert audio.log_mel_spectrogram(np.zeros(16001)).shape == (101, 128)
  assert audio.log_mel_spectrogram(np.zeros(8000)).shape == (50, 128)
  assert audio.log_mel_spectrogram(np.zeros(0)).shape == (0, 128)
  np.testing.assert_allclose(audio.log_mel_spectrogram(np.zeros(4000)), LOG_FLOOR, rtol=1e-7)
  # Magnitude (not power) spectrogram: doubling the signal adds log 2.
  wave = np.random.default_rng(1).standard_normal(16000).astype(np.float32)
  a, b = audio.log_mel_spectrogram(wave), audio.log_mel_spectrogram(2 * wave)
  loud = a > 0
  assert loud.mean() > 0.9
  np.testing.assert_allclose((b - a)[loud], math.log(2), atol=1e-3)


def test_mono_mixdown_and_pcm():
  rng = np.random.default_rng(2)
  left, right = rng.standard_normal((2, 8000)).astype(np.float32) * 0.2
  np.testing.assert_allclose(audio.log_mel_spectrogram(np.stack([left, right], axis=1)),
                             audio.log_mel_spectrogram((left + right) / 2), atol=1e-5)
  pcm = (left * 32768).astype(np.int16)
  np.testing.assert_allclose(audio.log_mel_spectrogram(pcm),
                             audio.log_mel_spectrogram(pcm.astype(np.float32) / 32768), atol=1e-5)
  with pytest.raises(ValueError, match="more channels than samples"):
    audio.log_mel_spectrogram(np.stack([left, right]))
  with pytest.raises(ValueError, match="Nyquist"):
    audio.log_mel_spectrogram(left, sample_rate=8000)


def test_audio_features_missing_is_zeros():
  for missing in (None, np.zeros(0, np.float32)):
    spec, has_audio = audio.audio_features(missing, num_frames=800, segment_frames=100,
                                           segment_stride_frames=300)
    assert not has_audio and spec.shape == (800, 128) and spec.dtype == np.float32
    assert not spec.any()


def test_audio_features_videocc_layout():
  wave = np.random.default_rng(3).standard_normal(30 * 16000).astype(np.float32) * 0.1
  spec, has_audio = audio.audio_features(wave, num_frames=800, segment_frames=100,
                                         segment_stride_frames=300, start_frame=150)
  assert has_audio and spec.shape == (800, 128)
  full = audio.log_mel_spectrogram(wave)
  for k in range(8):  # segment k = frames 150 + 300 k ... + 99
    np.testing.assert_array_equal(spec[100 * k:100 * (k + 1)],
                                  full[150 + 300 * k:250 + 300 * k])
  # Contiguous and short: 0.3 s = 30 frames (frames 28, 29 run past the end
  # and see zeros), then the silence floor.
  short, has_audio = audio.audio_features(wave[:4800], num_frames=100)
  assert has_audio
  np.testing.assert_allclose(short[:28], full[:28], atol=1e-5)
  np.testing.assert_allclose(short[30:], LOG_FLOOR)


@hypothesis.settings(max_examples=15, deadline=None)
@hypothesis.given(num_samples=st.integers(1, 8 * 16000), start=st.integers(-100, 900),
                  segments=st.sampled_from([(800, 100, 300), (200, 50, 60), (100, None, None)]))
def test_audio_features_equals_segments_of_full_spectrogram(num_samples, start, segments):
  # audio_features computes only the sampled frames; same result as cutting
  # the full spectrogram, including short recordings (spread / padded).
  num_frames, segment_frames, stride = segments
  wave = np.random.default_rng(num_samples).standard_normal(num_samples).astype(np.float32)
  full = audio.log_mel_spectrogram(wave)
  assert len(full) == audio.num_log_mel_frames(num_samples) == math.ceil(num_samples / 160)
  expected = audio.sample_spectrogram_segments(
      full, num_segments=num_frames // (segment_frames or num_frames),
      segment_frames=segment_frames or num_frames,
      segment_stride_frames=stride or segment_frames or num_frames, start=start)
  got, has_audio = audio.audio_features(wave, num_frames=num_frames, segment_frames=segment_frames,
                                        segment_stride_frames=stride, start_frame=start)
  assert has_audio
  np.testing.assert_allclose(got, expected, atol=1e-5)
  np.testing.assert_allclose(audio.log_mel_spectrogram(wave, frame_indices=[len(full) - 1, 0, 0]),
                             full[[-1, 0, 0]], atol=1e-5)


def test_audio_features_resamples_other_rates():
  # The same 1 kHz tone at 48 kHz and 16 kHz gives the same spectrogram.
  tone = lambda rate: 0.5 * np.sin(2 * np.pi * 1000 * np.arange(2 * rate) / rate)
  at_16k, _ = audio.audio_features(tone(16000), num_frames=100)
  at_48k, _ = audio.audio_features(tone(48000), sample_rate=48000, num_frames=100)
  loud = at_16k > 0
  assert loud.any()
  np.testing.assert_allclose(at_48k[loud], at_16k[loud], atol=0.05)
  assert at_48k.mean(0).argmax() == at_16k.mean(0).argmax()
