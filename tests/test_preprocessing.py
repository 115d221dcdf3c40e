"""Tests for avtext.data.preprocessing against hand-worked values and references.

References: hand-computed index lists (VideoCC §4.1, §5.2, app. C); TF's
tf.signal.stft + tf.signal.linear_to_mel_weight_matrix for the log-mel front
end; physical facts (a sine's energy lands in its mel band, silence gives the
log floor, magnitudes scale linearly); a slow pure-Python WordPiece written
from the BERT paper's description, reading ids straight from vocab.txt.
"""
import math
import pickle
import re
import subprocess
import sys
import textwrap
import unicodedata

import hypothesis
from hypothesis import strategies as st
import numpy as np
import pytest

from avtext.data import preprocessing as pp

SETTINGS = hypothesis.settings(max_examples=30, deadline=None)
LOG_FLOOR = math.log(1e-6)


# --- temporal sampling --------------------------------------------------------


def test_sample_frame_indices_centred_by_hand():
  # span = 3 * 10 + 1 = 31 of 100 frames; starts 0..69, centre 69 // 2 = 34.
  np.testing.assert_array_equal(pp.sample_frame_indices(100, 4, 10), [34, 44, 54, 64])
  assert pp.sample_frame_indices(100, 4, 10).dtype == np.int32


def test_sample_frame_indices_random_start_covers_all_starts():
  rng = np.random.default_rng(0)
  starts = set()
  for _ in range(200):
    idx = pp.sample_frame_indices(35, 4, 10, rng=rng)  # span 31: starts 0..4
    np.testing.assert_array_equal(np.diff(idx), [10, 10, 10])
    starts.add(int(idx[0]))
  assert starts == {0, 1, 2, 3, 4}


def test_videocc_clip_coverage():
  # §5.2 / Table 12: 32 frames at stride 14 at 25 fps cover ~18 s.
  idx = pp.sample_frame_indices(25 * 60, 32, 14, rng=np.random.default_rng(1))
  assert (idx[-1] - idx[0] + 1) / 25 == pytest.approx(17.4)


def test_short_video_spreads_in_order():
  # Span 16 > 10 frames: linspace(0, 9, 4) = 0, 3, 6, 9.
  np.testing.assert_array_equal(pp.sample_frame_indices(10, 4, 5), [0, 3, 6, 9])
  # Fewer frames than samples: linspace(0, 2, 5) = 0, .5, 1, 1.5, 2, rounded half up.
  np.testing.assert_array_equal(
      pp.sample_frame_indices(3, 5, 2, rng=np.random.default_rng(0)), [0, 1, 1, 2, 2])


def test_test_clip_indices_by_hand():
  # Starts linspace(0, 100 - 31, 4) = 0, 23, 46, 69; the last clip ends on frame 99.
  expected = np.array([0, 23, 46, 69])[:, None] + 10 * np.arange(4)
  np.testing.assert_array_equal(pp.test_clip_indices(100, 4, 10), expected)
  np.testing.assert_array_equal(pp.test_clip_indices(100, 4, 10, num_clips=1),
                                [pp.sample_frame_indices(100, 4, 10)])
  np.testing.assert_array_equal(pp.test_clip_indices(10, 4, 5, num_clips=3),
                                [[0, 3, 6, 9]] * 3)


@SETTINGS
@hypothesis.given(num_frames=st.integers(1, 400), num_samples=st.integers(1, 40),
                  stride=st.integers(1, 20), num_clips=st.integers(1, 6),
                  seed=st.integers(0, 2**16))
def test_indices_in_range_and_ordered(num_frames, num_samples, stride, num_clips, seed):
  idx = pp.sample_frame_indices(num_frames, num_samples, stride,
                                rng=np.random.default_rng(seed))
  clips = pp.test_clip_indices(num_frames, num_samples, stride, num_clips)
  assert clips.shape == (num_clips, num_samples)
  for row in [idx, *clips]:
    assert row.min() >= 0 and row.max() < num_frames
    assert np.all(np.diff(row) >= 0)
    if (num_samples - 1) * stride + 1 <= num_frames:
      assert np.all(np.diff(row) == stride)
  assert np.all(np.diff(clips[:, 0]) >= 0)


def test_sampling_rejects_bad_sizes():
  with pytest.raises(ValueError, match="num_frames"):
    pp.sample_frame_indices(0, 4, 2)
  with pytest.raises(ValueError, match="stride"):
    pp.test_clip_indices(10, 4, 0)


def test_audio_window_for_frames_by_hand():
  frames = np.arange(25, 50)  # 1 s of 25 fps video: [1 s, 2 s)
  assert pp.audio_window_for_frames(frames, 25, 16000) == (16000, 32000)
  assert pp.audio_window_for_frames(frames, 25, 100) == (100, 200)
  # 24 s of log-mel frames centred on 1.5 s reaches before the recording.
  assert pp.audio_window_for_frames(frames, 25, 100, 2400) == (-1050, 1350)
  # 32 frames at stride 14 from frame 100 (last 534): [4 s, 21.4 s), centre 12.7 s.
  clip = 100 + 14 * np.arange(32)
  assert pp.audio_window_for_frames(clip, 25, 100, 2200) == (170, 2370)


def _frame_numbered_spec(num_frames, bins=3):
  return np.repeat(np.arange(num_frames, dtype=np.float32)[:, None], bins, axis=1)


def test_spectrogram_segments_videocc_by_hand():
  # app. C: 8 x 100 frames, 300 apart; span 2200 of 3000 frames, centred at 400.
  out = pp.sample_spectrogram_segments(_frame_numbered_spec(3000))
  assert out.shape == (800, 3)
  expected = (400 + 300 * np.arange(8)[:, None] + np.arange(100)).reshape(-1)
  np.testing.assert_array_equal(out[:, 0], expected)
  clamped_low = pp.sample_spectrogram_segments(_frame_numbered_spec(3000), start=-50)
  assert clamped_low[0, 0] == 0 and clamped_low[-1, 0] == 2199
  clamped_high = pp.sample_spectrogram_segments(_frame_numbered_spec(3000), start=10**6)
  assert clamped_high[0, 0] == 800 and clamped_high[-1, 0] == 2999


def test_spectrogram_segments_short_audio():
  # 1000 < 2200 frames: starts spread over 0..900 = 900 * k / 7, rounded.
  out = pp.sample_spectrogram_segments(_frame_numbered_spec(1000), start=123)
  np.testing.assert_array_equal(out[::100, 0], [0, 129, 257, 386, 514, 643, 771, 900])
  # Shorter than one segment: padded with the silence floor, all segments equal.
  out = pp.sample_spectrogram_segments(_frame_numbered_spec(50), num_segments=2)
  np.testing.assert_array_equal(out[:50, 0], np.arange(50))
  np.testing.assert_allclose(out[50:100], LOG_FLOOR)
  np.testing.assert_array_equal(out[:100], out[100:])


# --- RGB frames -----------------------------------------------------------------


def _normalized(x, mean=0.5, std=0.5):
  return (np.asarray(x, np.float64) / 255 - mean) / std


def test_identity_at_target_size_up_to_normalization():
  frames = np.random.default_rng(0).integers(0, 256, (3, 16, 16, 3), np.uint8)
  out = pp.resize_crop_normalize(frames, size=16, train=False)
  assert out.dtype == np.float32 and out.shape == (3, 16, 16, 3)
  np.testing.assert_allclose(out, _normalized(frames), atol=1e-6)
  mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
  out = pp.resize_crop_normalize(frames, size=16, train=False, mean=mean, std=std)
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
  out = pp.resize_crop_normalize(frame[None], size=8, train=False)
  np.testing.assert_allclose(out, _normalized(np.full((1, 8, 8, 3), 200)), atol=1e-6)


def test_downscale_preserves_a_linear_ramp():
  # Bilinear resampling reproduces linear functions: halving a ramp 4x averages
  # columns 2j, 2j+1 -> 4 (2j + 0.5) away from the borders (uint8 rounding: +-1).
  ramp = np.broadcast_to((4 * np.arange(64))[None, None, :, None], (2, 64, 64, 3))
  out = pp.resize_crop_normalize(ramp.astype(np.uint8), size=32, train=False,
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
    out = pp.resize_crop_normalize(frames, size=64, train=True, rng=rng, mean=(0, 0, 0),
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
    out = pp.resize_crop_normalize(frames, rng=np.random.default_rng(seed), **full)
    np.testing.assert_allclose(out, _normalized(frames), atol=1e-6)
  flipped = 0
  for seed in range(20):
    out = pp.resize_crop_normalize(frames, rng=np.random.default_rng(seed), flip=True, **full)
    is_flipped = np.allclose(out, _normalized(frames[:, :, ::-1]), atol=1e-6)
    assert is_flipped or np.allclose(out, _normalized(frames), atol=1e-6)
    flipped += is_flipped
  assert 0 < flipped < 20


def test_resize_crop_normalize_errors():
  with pytest.raises(ValueError, match="needs an rng"):
    pp.resize_crop_normalize(np.zeros((1, 8, 8, 3), np.uint8), size=8, train=True)
  with pytest.raises(ValueError, match="uint8"):
    pp.resize_crop_normalize(np.zeros((1, 8, 8, 3), np.float32), size=8, train=False)


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
  np.testing.assert_allclose(pp.mel_weight_matrix(128, 512, 16000.0, 80.0, 7600.0),
                             ref_weights, atol=3e-5)
  ours = pp.log_mel_spectrogram(wave)
  assert ours.shape == ref.shape == (124, 128) and ours.dtype == np.float32
  np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4)


def _mel(hz):
  return 2595 * np.log10(1 + np.asarray(hz) / 700)  # HTK, as the TF docs write it


@pytest.mark.parametrize("freq", [1000.0, 3000.0])
def test_sine_peaks_in_its_mel_band(freq):
  wave = 0.5 * np.sin(2 * np.pi * freq * np.arange(16000) / 16000)
  spec = pp.log_mel_spectrogram(wave)
  centres = np.linspace(_mel(80), _mel(7600), 130)[1:-1]
  assert spec.shape == (100, 128)
  assert spec.mean(axis=0).argmax() == np.abs(centres - _mel(freq)).argmin()


def test_framing_silence_and_linearity():
  assert pp.log_mel_spectrogram(np.zeros(16000)).shape == (100, 128)
  assert pp.log_mel_spectrogram(np.zeros(16001)).shape == (101, 128)
  assert pp.log_mel_spectrogram(np.zeros(8000)).shape == (50, 128)
  assert pp.log_mel_spectrogram(np.zeros(0)).shape == (0, 128)
  np.testing.assert_allclose(pp.log_mel_spectrogram(np.zeros(4000)), LOG_FLOOR, rtol=1e-7)
  # Magnitude (not power) spectrogram: doubling the signal adds log 2.
  wave = np.random.default_rng(1).standard_normal(16000).astype(np.float32)
  a, b = pp.log_mel_spectrogram(wave), pp.log_mel_spectrogram(2 * wave)
  loud = a > 0
  assert loud.mean() > 0.9
  np.testing.assert_allclose((b - a)[loud], math.log(2), atol=1e-3)


def test_mono_mixdown_and_pcm():
  rng = np.random.default_rng(2)
  left, right = rng.standard_normal((2, 8000)).astype(np.float32) * 0.2
  np.testing.assert_allclose(pp.log_mel_spectrogram(np.stack([left, right], axis=1)),
                             pp.log_mel_spectrogram((left + right) / 2), atol=1e-5)
  pcm = (left * 32768).astype(np.int16)
  np.testing.assert_allclose(pp.log_mel_spectrogram(pcm),
                             pp.log_mel_spectrogram(pcm.astype(np.float32) / 32768), atol=1e-5)
  with pytest.raises(ValueError, match="more channels than samples"):
    pp.log_mel_spectrogram(np.stack([left, right]))
  with pytest.raises(ValueError, match="Nyquist"):
    pp.log_mel_spectrogram(left, sample_rate=8000)


def test_audio_features_missing_is_zeros():
  for missing in (None, np.zeros(0, np.float32)):
    spec, has_audio = pp.audio_features(missing, num_frames=800, segment_frames=100,
                                        segment_stride_frames=300)
    assert not has_audio and spec.shape == (800, 128) and spec.dtype == np.float32
    assert not spec.any()


def test_audio_features_videocc_layout():
  wave = np.random.default_rng(3).standard_normal(30 * 16000).astype(np.float32) * 0.1
  spec, has_audio = pp.audio_features(wave, num_frames=800, segment_frames=100,
                                      segment_stride_frames=300, start_frame=150)
  assert has_audio and spec.shape == (800, 128)
  full = pp.log_mel_spectrogram(wave)
  for k in range(8):  # segment k = frames 150 + 300 k ... + 99
    np.testing.assert_array_equal(spec[100 * k:100 * (k + 1)],
                                  full[150 + 300 * k:250 + 300 * k])
  # Contiguous and short: 0.3 s = 30 frames (frames 28, 29 run past the end
  # and see zeros), then the silence floor.
  short, has_audio = pp.audio_features(wave[:4800], num_frames=100)
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
  full = pp.log_mel_spectrogram(wave)
  assert len(full) == pp.num_log_mel_frames(num_samples) == math.ceil(num_samples / 160)
  expected = pp.sample_spectrogram_segments(
      full, num_segments=num_frames // (segment_frames or num_frames),
      segment_frames=segment_frames or num_frames,
      segment_stride_frames=stride or segment_frames or num_frames, start=start)
  got, has_audio = pp.audio_features(wave, num_frames=num_frames, segment_frames=segment_frames,
                                     segment_stride_frames=stride, start_frame=start)
  assert has_audio
  np.testing.assert_allclose(got, expected, atol=1e-5)
  np.testing.assert_allclose(pp.log_mel_spectrogram(wave, frame_indices=[len(full) - 1, 0, 0]),
                             full[[-1, 0, 0]], atol=1e-5)


def test_audio_features_resamples_other_rates():
  # The same 1 kHz tone at 48 kHz and 16 kHz gives the same spectrogram.
  tone = lambda rate: 0.5 * np.sin(2 * np.pi * 1000 * np.arange(2 * rate) / rate)
  at_16k, _ = pp.audio_features(tone(16000), num_frames=100)
  at_48k, _ = pp.audio_features(tone(48000), sample_rate=48000, num_frames=100)
  loud = at_16k > 0
  assert loud.any()
  np.testing.assert_allclose(at_48k[loud], at_16k[loud], atol=0.05)
  assert at_48k.mean(0).argmax() == at_16k.mean(0).argmax()


# --- text -----------------------------------------------------------------------


def _read_vocab(path):
  with open(path, encoding="utf-8") as f:
    return {line.rstrip("\n"): i for i, line in enumerate(f)}


def _ref_wordpieces(text, vocab):
  """Slow BERT uncased tokenization: lowercase, strip accents, split off
  punctuation, then greedy longest-match-first WordPiece per word."""
  text = "".join(c for c in unicodedata.normalize("NFD", text.lower())
                 if unicodedata.category(c) != "Mn")
  words = []
  for chunk in text.split():
    word = ""
    for c in chunk:
      if unicodedata.category(c).startswith("P") or (c.isascii() and not c.isalnum()):
        words += [word, c] if word else [c]
        word = ""
      else:
        word += c
    if word:
      words.append(word)
  pieces = []
  for word in words:
    start, out = 0, []
    while start < len(word):
      end = len(word)
      while end > start and (("##" if start else "") + word[start:end]) not in vocab:
        end -= 1
      if end == start:
        out = ["[UNK]"]
        break
      out.append(("##" if start else "") + word[start:end])
      start = end
    pieces += out
  return pieces


@pytest.fixture(scope="module")
def bert_vocab_path():
  from avtext import assets
  return assets.minilm_l6_dir() / "vocab.txt"


def test_bert_ids_by_hand(bert_vocab_path):
  vocab = _read_vocab(bert_vocab_path)
  assert (vocab["[PAD]"], vocab["[CLS]"], vocab["[SEP]"]) == (0, 101, 102)
  tok = pp.Tokenizer(bert_vocab_path)
  out = tok("A man is playing a guitar.")
  words = ["a", "man", "is", "playing", "a", "guitar", "."]
  expected = [101] + [vocab[w] for w in words] + [102]
  np.testing.assert_array_equal(out["input_ids"][:9], expected)
  np.testing.assert_array_equal(out["input_ids"][9:], 0)
  np.testing.assert_array_equal(out["attention_mask"], [1] * 9 + [0] * 23)
  assert out["input_ids"].dtype == np.int32 and out["input_ids"].shape == (32,)


def test_matches_reference_wordpiece(bert_vocab_path):
  vocab = _read_vocab(bert_vocab_path)
  texts = ["The skateboarder's tricks impressed everyone!",
           "Café crème, s'il vous plaît -- two dogs chase a frisbee in 4K.",
           "A GIRL IS RIDING A UNICYCLE",
           ""]
  out = pp.Tokenizer(bert_vocab_path)(texts)
  assert out["input_ids"].shape == (4, 32)
  for text, ids, mask in zip(texts, out["input_ids"], out["attention_mask"]):
    pieces = ["[CLS]"] + _ref_wordpieces(text, vocab) + ["[SEP]"]
    assert len(pieces) <= 32
    np.testing.assert_array_equal(ids[:len(pieces)], [vocab[p] for p in pieces])
    assert mask.sum() == len(pieces) and not ids[len(pieces):].any()
  assert "##board" in _ref_wordpieces("skateboarder", vocab)  # a real sub-word split


def test_crop_keeps_sep_last(bert_vocab_path):
  vocab = _read_vocab(bert_vocab_path)
  words = ("one two three four five six seven eight nine ten " * 4).split()
  out = pp.Tokenizer(bert_vocab_path)(" ".join(words))
  expected = [101] + [vocab[w] for w in words[:30]] + [102]
  np.testing.assert_array_equal(out["input_ids"], expected)
  assert out["attention_mask"].all()


def test_tiny_vocab_by_hand(tmp_path):
  path = tmp_path / "vocab.txt"
  path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "man",
                             "play", "##ing", "."]) + "\n")
  tok = pp.Tokenizer(path, max_len=8)
  np.testing.assert_array_equal(tok("A man playing.")["input_ids"], [2, 5, 6, 7, 8, 9, 3, 0])
  np.testing.assert_array_equal(tok(["A man playing."])["input_ids"],
                                [[2, 5, 6, 7, 8, 9, 3, 0]])
  np.testing.assert_array_equal(pp.Tokenizer(path, max_len=5)("a man playing dog")["input_ids"],
                                [2, 5, 6, 7, 3])  # cropped: [CLS] a man play [SEP]
  np.testing.assert_array_equal(tok("a dog")["input_ids"], [2, 5, 1, 3, 0, 0, 0, 0])


def test_missing_vocab_names_the_path(tmp_path):
  missing = tmp_path / "nope" / "vocab.txt"
  with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
    pp.Tokenizer(missing)
  with pytest.raises(ValueError, match="max_len"):
    pp.Tokenizer(max_len=1)


def test_tokenizer_pickles_before_and_after_use(bert_vocab_path):
  tok = pp.Tokenizer(bert_vocab_path)
  fresh = pickle.loads(pickle.dumps(tok))
  texts = ["a dog runs", "two cats sleep on a sofa"]
  first = tok(texts)
  used = pickle.loads(pickle.dumps(tok))
  for other in (fresh, used):
    for key in ("input_ids", "attention_mask"):
      np.testing.assert_array_equal(other(texts)[key], first[key])
  assert tok.vocab_size == 30522


def test_tokenizer_first_use_from_many_threads(bert_vocab_path):
  """grain's reader threads tokenize at once on a fresh tokenizer: every call must work.

  Run in a fresh interpreter, where transformers is not imported yet; its lazy
  module import used to fail in all but one thread.
  """
  script = textwrap.dedent(f"""
      import sys, threading
      from avtext.data import preprocessing
      assert "transformers" not in sys.modules
      tok = preprocessing.Tokenizer({str(bert_vocab_path)!r}, max_len=8)
      out, errors = [], []
      def work():
        try:
          out.append(tok("a red circle")["input_ids"].tolist())
        except Exception as e:  # reported below
          errors.append(repr(e))
      threads = [threading.Thread(target=work) for _ in range(8)]
      for t in threads:
        t.start()
      for t in threads:
        t.join()
      print(len(out), len(set(map(tuple, out))), errors[:1])
      """)
  run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=300, check=False)
  assert run.returncode == 0, run.stderr[-2000:]
  assert run.stdout.split()[:2] == ["8", "1"], run.stdout
