"""Captions spoken as word tones, and ASR transcripts with seeded word errors.

The default speech of the synthetic S-MiT (`spoken_clips`; `tts` is the real-speech one).

S-MiT pairs each 3 s clip with a spoken description and its ASR transcript
(Monfort et al. 2021, sec. 3-4). The synthetic variant makes both from a
clip's caption, with no system package:

- `render_speech(caption, speaker)`: 16 kHz audio. Every word has its own
  sound pattern, a pure function of the word (`word_pattern`: 2-3 syllables,
  each two "formants" on a grid of 1/8 octave between 200 Hz and 2.9 kHz, with
  a harmonic, and its own syllable length; 768 kinds of syllable); a `Speaker` scales all frequencies (pitch) and
  durations (tempo) and adds seeded white noise. The same (caption, speaker)
  gives the same samples bit for bit; different word sequences give different
  audio (distinct patterns; `tests/test_data_synthetic_tone_speech.py`).
- `asr_transcript(rng, caption, wer)`: the caption with seeded word errors: each
  word independently becomes another vocabulary word (probability
  `wer * substitution_share`) or is dropped (the rest of `wer`), so the
  expected word error rate against the caption is `wer` (default 15 %, the
  order of a public ASR engine's on S-MiT's spoken captions).
- `word_error_rate(references, hypotheses)`: corpus WER, (S + D + I) / N by
  word-level Levenshtein alignment (its home is `avtext.data.asr`, beside the real
  engine; `tts.render_speech` is the real-speech renderer).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
from typing import Sequence

import numpy as np

from avtext.data.asr import word_error_rate  # pylint: disable=unused-import
from avtext.data.asr import words

SAMPLE_RATE = 16_000
_GRID = 200.0 * 2.0 ** (np.arange(32) / 8.0)  # 32 steps of 1/8 octave, 200 Hz .. 2.9 kHz
_SYLLABLE_S = (0.09, 0.12, 0.15)  # base syllable lengths
_GAP_S = 0.06  # base pause between words


@dataclasses.dataclass(frozen=True)
class Speaker:
  """How one clip's caption is spoken: pitch and tempo factors, noise level."""
  pitch: float = 1.0  # multiplies every frequency
  tempo: float = 1.0  # > 1 speaks faster (durations divided by it)
  noise: float = 0.02  # white-noise std, relative to full scale
  seed: int = 0  # the noise stream

  def __post_init__(self):
    if not (0.5 <= self.pitch <= 2.0 and 0.5 <= self.tempo <= 2.0 and 0.0 <= self.noise <= 1.0):
      raise ValueError(f"Speaker: expected pitch and tempo in [0.5, 2] and noise in [0, 1], "
                       f"got {self}")


def sample_speaker(rng: np.random.Generator) -> Speaker:
  """A speaker of the synthetic corpus: pitch 0.8-1.25, tempo 0.85-1.2, noise 0-0.05."""
  return Speaker(pitch=float(2.0 ** rng.uniform(np.log2(0.8), np.log2(1.25))),
                 tempo=float(rng.uniform(0.85, 1.2)), noise=float(rng.uniform(0.0, 0.05)),
                 seed=int(rng.integers(2**31)))


@functools.lru_cache(maxsize=4096)
def word_pattern(word: str) -> tuple[tuple[float, float, float], ...]:
  """The word's syllables as (formant 1 Hz, formant 2 Hz, length s), from its hash."""
  h = hashlib.blake2b(word.encode(), digest_size=16).digest()
  n = 2 + min(1, len(word) // 6)  # 2-3 syllables by spelling length
  out = []
  for s in range(n):
    a, b, c = h[3 * s], h[3 * s + 1], h[3 * s + 2]
    f1 = _GRID[a % 16]  # low formant in the lower half of the grid
    f2 = _GRID[16 + b % 16]  # high formant in the upper half
    out.append((float(f1), float(f2), _SYLLABLE_S[c % 3]))
  return tuple(out)


def _syllable(f1: float, f2: float, length_s: float, speaker: Speaker) -> np.ndarray:
  n = max(8, int(round(length_s / speaker.tempo * SAMPLE_RATE)))
  t = np.arange(n) / SAMPLE_RATE
  env = np.sin(np.pi * (np.arange(n) + 0.5) / n) ** 2  # smooth on/off
  wave = (0.6 * np.sin(2 * np.pi * f1 * speaker.pitch * t)
          + 0.3 * np.sin(2 * np.pi * f2 * speaker.pitch * t)
          + 0.1 * np.sin(4 * np.pi * f1 * speaker.pitch * t))  # a harmonic of the first
  return (0.5 * env * wave).astype(np.float32)


def render_speech(caption: str, speaker: Speaker = Speaker()) -> np.ndarray:
  """float32 16 kHz samples in [-1, 1] of the caption spoken by `speaker`."""
  parts = []
  gap = np.zeros(int(round(_GAP_S / speaker.tempo * SAMPLE_RATE)), np.float32)
  for w in words(caption):
    parts.extend(_syllable(*syl, speaker) for syl in word_pattern(w))
    parts.append(gap)
  if not parts:
    raise ValueError(f"render_speech: caption {caption!r} has no words")
  audio = np.concatenate([gap] + parts)
  if speaker.noise:
    audio = audio + speaker.noise * np.random.default_rng(speaker.seed).standard_normal(
        audio.shape).astype(np.float32)
  return np.clip(audio, -1.0, 1.0)


def asr_transcript(rng: np.random.Generator, caption: str, vocabulary: Sequence[str], *,
                   wer: float = 0.15, substitution_share: float = 0.7) -> str:
  """The caption's words with seeded substitutions (by a different vocabulary word) and
  deletions, at expected word error rate `wer` (module docstring)."""
  if not 0.0 <= wer <= 1.0 or not 0.0 <= substitution_share <= 1.0:
    raise ValueError(f"asr_transcript: expected wer and substitution_share in [0, 1], got "
                     f"{wer}, {substitution_share}")
  vocab = sorted(set(vocabulary))
  if len(vocab) < 2 and wer * substitution_share > 0:
    raise ValueError("asr_transcript: substitutions need a vocabulary of >= 2 words")
  out = []
  for w in words(caption):
    u = rng.random()
    if u < wer * substitution_share:
      other = vocab[int(rng.integers(len(vocab) - 1))]
      out.append(other if other != w else vocab[-1])
    elif u >= wer:
      out.append(w)
  return " ".join(out)
