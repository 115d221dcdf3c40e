"""Spoken captions and ASR noise of the synthetic S-MiT variant (avworld/tone_speech.py)."""
import hashlib
import json

import numpy as np
import pytest

from avworld import captions
from avworld import tone_speech
from avworld.clips import ClipCaptionSource


def _captions(n, split="train"):
  src = ClipCaptionSource(split, num_examples=n)
  return [src.describe(i)["caption"] for i in range(n)]


def test_word_error_rate_hand_computed():
  # "a b c d" -> "a x d": one substitution (b->x), one deletion (c): 2 / 4.
  assert tone_speech.word_error_rate(["a b c d"], ["a x d"]) == 0.5
  # An insertion counts too; corpus WER pools the words: (0 + 1) / (2 + 3).
  assert tone_speech.word_error_rate(["Red box.", "a b c"], ["red box", "a b z c"]) == 0.2
  with pytest.raises(ValueError, match="2 references but 1"):
    tone_speech.word_error_rate(["a", "b"], ["a"])


def test_asr_noise_hits_the_configured_wer_on_1000_captions():
  texts = _captions(1000)
  vocab = captions.caption_vocabulary()
  for wer in (0.15, 0.3):
    rng = np.random.default_rng(0)
    noisy = [tone_speech.asr_transcript(rng, t, vocab, wer=wer) for t in texts]
    assert abs(tone_speech.word_error_rate(texts, noisy) - wer) <= 0.02
  rng = np.random.default_rng(0)
  assert [tone_speech.asr_transcript(rng, t, vocab, wer=0.0) for t in texts[:20]] == [
      " ".join(tone_speech.words(t)) for t in texts[:20]]
  with pytest.raises(ValueError, match="wer"):
    tone_speech.asr_transcript(rng, texts[0], vocab, wer=1.5)


def test_caption_vocabulary_covers_every_caption_and_words_sound_distinct():
  vocab = set(captions.caption_vocabulary())
  for t in _captions(2000, "val"):
    assert set(tone_speech.words(t)) <= vocab, t
  patterns = [tone_speech.word_pattern(w) for w in sorted(vocab)]
  assert len(set(patterns)) == len(patterns)


def test_renderer_is_deterministic_and_distinct_captions_sound_different():
  texts = _captions(300)
  speaker = tone_speech.Speaker(pitch=1.1, tempo=0.9, noise=0.03, seed=7)
  a = tone_speech.render_speech(texts[0], speaker)
  np.testing.assert_array_equal(a, tone_speech.render_speech(texts[0], speaker))
  assert a.dtype == np.float32 and np.abs(a).max() <= 1.0
  # Another speaker, same words: different audio.
  assert not np.array_equal(a, tone_speech.render_speech(texts[0], tone_speech.Speaker(pitch=0.9)))
  # Different word sequences never render the same audio, with or without noise.
  by_words = {tuple(tone_speech.words(t)): t for t in texts}
  for noise in (0.0, 0.03):
    s = tone_speech.Speaker(noise=noise, seed=1)
    digests = {hashlib.sha256(tone_speech.render_speech(t, s).tobytes()).hexdigest()
               for t in by_words.values()}
    assert len(digests) == len(by_words)
  with pytest.raises(ValueError, match="no words"):
    tone_speech.render_speech("...", speaker)


def test_a_syllable_sounds_at_its_pattern_frequency_times_the_pitch():
  word = "circle"
  (f1, f2, length), *_ = tone_speech.word_pattern(word)
  for pitch in (1.0, 1.2):
    audio = tone_speech.render_speech(word, tone_speech.Speaker(pitch=pitch, noise=0.0))
    gap = int(round(0.06 * tone_speech.SAMPLE_RATE))
    first = audio[gap:gap + int(round(length * tone_speech.SAMPLE_RATE))]
    spectrum = np.abs(np.fft.rfft(first * np.hanning(len(first)), n=1 << 16))
    freqs = np.fft.rfftfreq(1 << 16, 1 / tone_speech.SAMPLE_RATE)
    peak = freqs[np.argmax(spectrum)]
    assert abs(peak - f1 * pitch) < 15.0  # the strongest partial is formant 1
    upper = freqs > 1.5 * f1 * pitch  # formant 2 (0.3) outweighs formant 1's harmonic (0.1)
    assert abs(freqs[upper][np.argmax(spectrum[upper])] - f2 * pitch) < 15.0
  # Tempo divides durations.
  slow = tone_speech.render_speech(word, tone_speech.Speaker(tempo=0.5, noise=0.0))
  fast = tone_speech.render_speech(word, tone_speech.Speaker(tempo=1.0, noise=0.0))
  assert abs(len(slow) / len(fast) - 2.0) < 0.01


def test_spoken_source_from_the_registry():
  import ml_collections  # pylint: disable=g-import-not-at-top
  from avtext.data import builders  # pylint: disable=g-import-not-at-top
  cfg = ml_collections.ConfigDict(dict(name="synthetic_smit", num_train=1000, num_eval=2000,
                                       asr_wer=0.2))
  train = builders.get_source(cfg, "train")
  test = builders.get_source(cfg, "test")
  assert (len(train), len(test)) == (1000, 2000)
  assert train.spec.duration_s == 3.0
  # The clips are the clip variant's (same stream), the speech streams are its own.
  plain = ClipCaptionSource("train", num_examples=10, spec=train.spec)
  d = train.describe(3)
  assert d["caption"] == plain.describe(3)["caption"]
  assert d["transcript"] == train.describe(3)["transcript"]  # random access, deterministic
  texts = [train.describe(i)["caption"] for i in range(1000)]
  heard = [train.describe(i)["transcript"] for i in range(1000)]
  assert abs(tone_speech.word_error_rate(texts, heard) - 0.2) <= 0.02
  speakers = {tuple(sorted(train.describe(i)["speaker"].items())) for i in range(50)}
  assert len(speakers) == 50
  full = train[3]
  np.testing.assert_array_equal(full["spoken_caption"], train.render_speech(3))
  np.testing.assert_array_equal(
      full["spoken_caption"],
      tone_speech.render_speech(d["caption"], tone_speech.Speaker(**d["speaker"])))
  assert full["frames"].shape[0] == 75  # 3 s at 25 fps
  # Splits do not share clips: their scenes' continuous nuisance draws never coincide.
  def draws(src, n):
    return {json.dumps(src.describe(i)["attributes"]["nuisance"], sort_keys=True)
            for i in range(n)}
  assert not draws(train, 1000) & draws(test, 2000)


def test_speech_features_crop_and_pad():
  from avtext.data import audio  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  wave = rng.uniform(-0.5, 0.5, 25 * 16000).astype(np.float32)
  feats, mask = audio.speech_features(wave, num_frames=1000, crop_s=10.0,
                                      rng=np.random.default_rng(4))
  assert feats.shape == (1000, 40) and mask.sum() == 1000  # 10 s at 100 frames a second
  start = int(np.random.default_rng(4).integers(0, 15 * 16000 + 1))
  np.testing.assert_allclose(feats, audio.log_mel_spectrogram(
      wave[start:start + 160000], num_mel_bins=40), rtol=1e-6)
  # Test: the whole 4 s caption, then the silence floor.
  short, mask = audio.speech_features(wave[:64000], num_frames=1000)
  assert mask.sum() == 400 and mask[:400].all()
  np.testing.assert_allclose(short[400:], np.log(np.float32(audio.LOG_OFFSET)))
