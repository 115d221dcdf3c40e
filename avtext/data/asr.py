"""Speech recognition of spoken captions (S-MiT's ASR transcripts) and its word error rate.

S-MiT's language-caption model reads what an ASR engine heard in the spoken caption
(Monfort et al. 2021, sec. 4.2.1). `Recognizer` is a real engine: CMU pocketsphinx
(pinned in requirements.lock) with the US-English acoustic model its wheel ships,
decoding 16 kHz float audio.

Its language model is either the wheel's general English trigram model
(`lm_dir=None`) or one built by `build_language_model` from a list of sentences: a
trigram ARPA model (pocketsphinx's own `ArpaBoLM`, absolute discounting) and the
dictionary restricted to their words (CMUdict pronunciations). Built from a
dataset's TRAINING captions only, it is the domain language model an engineer
deploying ASR on such captions would fit; it never sees the captions it is scored on.

`word_error_rate(references, hypotheses)`: corpus WER, (S + D + I) / N by word-level
Levenshtein alignment, on lower-cased words with punctuation dropped (`words`).
"""
from __future__ import annotations

import os
import pathlib
import re
from typing import Iterable, Sequence

import numpy as np

SAMPLE_RATE = 16_000
_WORD = re.compile(r"[a-z']+")
# CMUdict lacks these British spellings of the synthetic world's vocabulary.
EXTRA_PRONUNCIATIONS = {"chequered": "CH EH K ER D", "stripy": "S T R AY P IY"}


def words(text: str) -> list[str]:
  """Lower-cased words of a caption (punctuation dropped; 'siren-like' is two words)."""
  return _WORD.findall(text.lower())


def _edit_distance(ref: Sequence[str], hyp: Sequence[str]) -> int:
  prev = list(range(len(hyp) + 1))
  for i, r in enumerate(ref, 1):
    cur = [i] + [0] * len(hyp)
    for j, h in enumerate(hyp, 1):
      cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h))
    prev = cur
  return prev[-1]


def word_error_rate(references: Sequence[str], hypotheses: Sequence[str]) -> float:
  """Corpus WER: total word edit distance / total reference words."""
  if len(references) != len(hypotheses):
    raise ValueError(f"word_error_rate: {len(references)} references but "
                     f"{len(hypotheses)} hypotheses")
  errors = sum(_edit_distance(words(r), words(h)) for r, h in zip(references, hypotheses))
  total = sum(len(words(r)) for r in references)
  if not total:
    raise ValueError("word_error_rate: the references have no words")
  return errors / total


def _model_path() -> pathlib.Path:
  try:
    import pocketsphinx  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError("the ASR engine needs pocketsphinx==5.1.1 (requirements.lock; "
                      "`make venv` installs it)") from e
  return pathlib.Path(pocketsphinx.get_model_path()) / "en-us"


def build_language_model(sentences: Iterable[str], out_dir: str | os.PathLike
                         ) -> pathlib.Path:
  """Writes <out_dir>/lm.arpa (trigram) and <out_dir>/words.dict for `sentences`."""
  from pocketsphinx.lm import ArpaBoLM  # pylint: disable=g-import-not-at-top
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  lines = [" ".join(words(s)) for s in sentences]
  lines = [line for line in lines if line]
  if not lines:
    raise ValueError("build_language_model: no sentence has a word")
  vocab = sorted({w for line in lines for w in line.split()})
  pronunciations: dict[str, list[str]] = {w: [] for w in vocab}
  with open(_model_path() / "cmudict-en-us.dict") as f:
    for line in f:
      key, _, phones = line.strip().partition(" ")
      base = re.sub(r"\(\d+\)$", "", key)
      if base in pronunciations:
        pronunciations[base].append(f"{key} {phones}")
  for w, phones in EXTRA_PRONUNCIATIONS.items():
    if w in pronunciations and not pronunciations[w]:
      pronunciations[w].append(f"{w} {phones}")
  missing = [w for w, p in pronunciations.items() if not p]
  if missing:
    raise ValueError(f"build_language_model: no pronunciation for {missing[:10]}; add them to "
                     f"asr.EXTRA_PRONUNCIATIONS (CMUdict phones)")
  (out / "words.dict").write_text("".join(p + "\n" for w in vocab for p in pronunciations[w]))
  lm = ArpaBoLM(text="\n".join(lines) + "\n", add_start=True)
  lm.compute()
  lm.write_file(str(out / "lm.arpa"))
  return out


class Recognizer:
  """pocketsphinx on 16 kHz audio; `lm_dir` from `build_language_model`, or None for the
  wheel's general English language model and dictionary."""

  def __init__(self, lm_dir: str | os.PathLike | None = None):
    from pocketsphinx import Decoder  # pylint: disable=g-import-not-at-top
    model = _model_path()
    if lm_dir is None:
      lm, dic = model / "en-us.lm.bin", model / "cmudict-en-us.dict"
    else:
      lm, dic = pathlib.Path(lm_dir) / "lm.arpa", pathlib.Path(lm_dir) / "words.dict"
      if not lm.is_file() or not dic.is_file():
        raise FileNotFoundError(f"{lm_dir}: no lm.arpa / words.dict; write them with "
                                f"asr.build_language_model (the demo world's smit_asr tool does)")
    self._decoder = Decoder(hmm=str(model / "en-us"), lm=str(lm), dict=str(dic),
                            samprate=SAMPLE_RATE, logfn=os.devnull)

  def transcribe(self, audio: np.ndarray) -> str:
    """The words heard in float audio in [-1, 1] at 16 kHz ('' when none)."""
    pcm = np.clip(np.round(np.asarray(audio, np.float32) * 32767.0), -32768, 32767)
    self._decoder.start_utt()
    self._decoder.process_raw(pcm.astype(np.int16).tobytes(), full_utt=True)
    self._decoder.end_utt()
    hyp = self._decoder.hyp()
    return " ".join(words(hyp.hypstr)) if hyp is not None else ""
