"""Real speech of the synthetic S-MiT (avworld/tts.py) and the ASR engine that
hears it (avtext/data/asr.py)."""
import dataclasses
import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest

from avtext.data import asr
from avworld import spoken_clips
from avworld import tts
from avworld import world
from avworld.clips import ClipCaptionSource

CAPTIONS = ("A scarlet object, accompanied by a siren-like sweep.",
            "The video shows one violet block sinking over a fading backdrop.")
VOICES = (tts.Voice("en-us", "f3", pitch=40, rate=160, reverb_s=0.2, snr_db=30.0, seed=5),
          tts.Voice("en-gb-x-rp", "m2", pitch=60, rate=190, seed=1))


def _digests(order):
  return [hashlib.sha256(tts.render_speech(CAPTIONS[c], VOICES[v]).tobytes()).hexdigest()
          for c, v in order]


def test_same_caption_and_voice_give_the_same_samples_in_another_process_and_order():
  order = [(0, 0), (1, 1), (0, 1), (1, 0)]
  here = dict(zip(order, _digests(order)))
  # Another process renders them in the reverse order, after an unrelated utterance.
  script = (f"import json; from avworld import tts; import test_data_synthetic_tts as t; "
            f"tts.render_speech('a red ball', tts.Voice('en', 'm7')); "
            f"print(json.dumps(t._digests({order[::-1]})))")
  out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       check=True, cwd=__file__.rsplit("/", 1)[0])
  there = dict(zip(order[::-1], json.loads(out.stdout.strip().splitlines()[-1])))
  assert here == there
  assert len(set(here.values())) == 4  # every caption x voice sounds different


def test_an_utterance_does_not_depend_on_the_voices_spoken_before():
  """21 captions of make demo-smit's world, rendered again after every 20 of 60 short
  utterances in the 48 voices, are the same samples (a helper process that kept the last
  voice loaded, as it once did, changed 10 of them by the third time)."""
  spec = world.WorldSpec(duration_s=3.0, fps=25, height=64, width=64, sample_rate=16_000)
  source = spoken_clips.SpokenClipSource("test", num_examples=160, spec=spec, speech="espeak")
  clips = [(source.describe(i)["caption"], source._speech(i)[0]) for i in range(131, 152)]

  def digests():
    return [hashlib.sha256(tts.render_speech(c, v).tobytes()).hexdigest()[:16] for c, v in clips]

  before = digests()
  voices = [tts.Voice(language, variant) for language in tts.LANGUAGES for variant in tts.VARIANTS]
  for k in range(1, 61):
    tts.render_speech("a", voices[k % len(voices)])
    if k % 20 == 0:
      assert digests() == before, f"after {k} utterances"


def test_render_speech_is_16khz_float_in_range_and_errors_name_the_field():
  wave = tts.render_speech(CAPTIONS[0], VOICES[0])
  assert wave.dtype == np.float32 and np.abs(wave).max() <= 1.0
  # ~2.5-4 s for 9 words at 160 words/min + the room's tail, at 16 kHz.
  assert 2.0 * tts.SAMPLE_RATE < len(wave) < 5.0 * tts.SAMPLE_RATE
  with pytest.raises(ValueError, match="no words"):
    tts.render_speech("...", VOICES[0])
  with pytest.raises(ValueError, match="xx-nothing"):
    tts.render_speech("a ball", tts.Voice("xx-nothing"))
  with pytest.raises(ValueError, match="rate"):
    tts.Voice(rate=20)
  with pytest.raises(ValueError, match="dataset.speech"):
    spoken_clips.SpokenClipSource("test", num_examples=2, speech="tone")


def test_a_room_shorter_than_one_sample_is_no_reverberation():
  # sample_voice draws reverb_s from [0, 0.25): below 1/16000 s it is 0 samples long.
  dry = tts.Voice("en-us", "m1", reverb_s=0.0, snr_db=30.0, seed=3)
  wave = tts.render_speech(CAPTIONS[1], dataclasses.replace(dry, reverb_s=1e-5))
  np.testing.assert_array_equal(wave, tts.render_speech(CAPTIONS[1], dry))


def test_word_error_rate_hand_counted():
  # ref 9 words: a scarlet object accompanied by a siren like sweep; the hypothesis
  # substitutes scarlet -> solid and drops object: 2 errors.
  assert asr.word_error_rate([CAPTIONS[0]], ["a solid accompanied by a siren like sweep"]) == (
      pytest.approx(2 / 9))
  # an inserted word (the), a substitution (ball -> box): (1 + 1) / 4 words.
  assert asr.word_error_rate(["a ball heading left"], ["the a box heading left"]) == 0.5
  # nothing heard: every reference word deleted; pooled over two captions (3 + 0) / (3 + 2).
  assert asr.word_error_rate(["one red disc", "no sound"], ["", "no sound"]) == 0.6
  with pytest.raises(ValueError, match="2 references but 1"):
    asr.word_error_rate(["a", "b"], ["a"])


@pytest.fixture(scope="module")
def world_lm(tmp_path_factory):
  train = ClipCaptionSource("train", num_examples=300)
  return asr.build_language_model((train.describe(i)["caption"] for i in range(300)),
                                  tmp_path_factory.mktemp("lm"))


def test_pocketsphinx_hears_at_least_half_the_words_of_rendered_test_captions(world_lm):
  test = ClipCaptionSource("test", num_examples=4)
  refs = [test.describe(i)["caption"] for i in range(4)]
  rec = asr.Recognizer(world_lm)
  hyps = [rec.transcribe(tts.render_speech(r, VOICES[i % 2])) for i, r in enumerate(refs)]
  # An engine that never saw these captions, their audio or the renderer: if the
  # renderer said something other than the words, this could not pass.
  assert asr.word_error_rate(refs, hyps) <= 0.5, list(zip(refs, hyps))


def test_a_real_engines_transcripts_replace_the_seeded_errors(tmp_path):
  import ml_collections  # pylint: disable=g-import-not-at-top
  from avtext.data import builders  # pylint: disable=g-import-not-at-top
  heard = ["a red ball", "", "two shapes"]
  (tmp_path / "test.json").write_text(json.dumps({"transcripts": heard}))
  dataset = ml_collections.ConfigDict(dict(name="synthetic_smit", num_eval=3,
                                           asr_transcripts=str(tmp_path)))
  source = builders.get_source(dataset, "test")
  assert [source.describe(i)["transcript"] for i in range(3)] == heard
  plain = builders.get_source(ml_collections.ConfigDict(dict(name="synthetic_smit", num_eval=3)),
                              "test")
  assert [plain.describe(i)["caption"] for i in range(3)] == [
      source.describe(i)["caption"] for i in range(3)]  # the clips are the same
  with pytest.raises(FileNotFoundError, match="dataset.asr_transcripts.*--splits=val"):
    builders.get_source(dataset, "val")
  dataset.num_eval = 4
  with pytest.raises(ValueError, match="3 ASR transcripts for 4 clips"):
    builders.get_source(dataset, "test")
