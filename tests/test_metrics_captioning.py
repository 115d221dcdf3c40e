"""Tests for avtext.metrics.captioning (COOT Sec. 4.4, Tables 4-5).

Expectations are worked out by hand in the comments, or come from sacrebleu
(BLEU) and from pycocoevalcap driven the way its COCOEvalCap.evaluate does.
The Java-free path is tested by hiding `java` from shutil.which.
"""
import math
import shutil

import pytest
import sacrebleu
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.meteor.meteor import Meteor
from pycocoevalcap.rouge.rouge import Rouge
from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

from avtext.metrics import captioning

_HAVE_JAVA = shutil.which("java") is not None
needs_java = pytest.mark.skipif(not _HAVE_JAVA, reason="java is not installed")

# Ordinary captions with case, punctuation and clitics: the PTB tokenizer and
# fallback_tokenize agree on all of them.
_REFS = {
    "v0": ["A man is riding a horse on the beach.", "Someone rides a brown horse."],
    "v1": ["The chef slices an onion, then adds salt.", "A cook cuts onions on a board."],
    "v2": ["Two dogs play in the snow!", "A pair of dogs runs through snow."],
    "v3": ["She isn't happy about the man's car.", "A woman looks upset at a car."],
    "v4": ["The kids (three of them) jump into a pool.", "Children are jumping into a pool."],
}
_HYPS = {
    "v0": "A man rides a horse on the beach",
    "v1": "a chef cuts an onion and adds salt.",
    "v2": "dogs are playing in the snow",
    "v3": "A woman isn't happy with a car.",
    "v4": "Three kids jump into the pool!",
}


@pytest.fixture
def no_java(monkeypatch):
  real_which = shutil.which
  monkeypatch.setattr(shutil, "which", lambda cmd, *a, **k: None if cmd == "java" else
                      real_which(cmd, *a, **k))


def _quiet(references, hypotheses):
  with pytest.warns(RuntimeWarning, match="java not found"):
    return captioning.caption_metrics(references, hypotheses)


# ------------------------------------------------------ hand-computed (no Java)

def test_bleu_and_rouge_hand_computed(no_java):
  got = _quiet({0: ["The cat is on the mat."]}, {0: "The cat sat on the mat."})
  # hyp "the cat sat on the mat" vs ref "the cat is on the mat", equal lengths:
  # 1-grams 5/6, 2-grams 3/5 (the cat, on the, the mat), 3-grams 1/4, 4-grams 0/3.
  assert got["BLEU-1"] == pytest.approx(5 / 6, rel=1e-8)
  assert got["BLEU-2"] == pytest.approx(math.sqrt(5 / 6 * 3 / 5), rel=1e-8)
  assert got["BLEU-3"] == pytest.approx(0.5, rel=1e-8)  # (5/6 * 3/5 * 1/4) ** (1/3).
  assert got["BLEU-4"] < 1e-3  # Zero 4-gram matches; pycocoevalcap adds 1e-15.
  # LCS "the cat on the mat" = 5: P = R = 5/6, so F_beta = 5/6 for any beta.
  assert got["ROUGE-L"] == pytest.approx(5 / 6, rel=1e-12)
  assert got["CIDEr-D"] == 0.0  # One caption: every idf is log(1/1) = 0.
  assert "METEOR" not in got


def test_bleu_brevity_penalty_uses_closest_reference(no_java):
  got = _quiet({0: ["the cat sat on the mat"]}, {0: "the cat"})
  # All n-grams match, c = 2, r = 6: BP = exp(1 - 6/2).
  assert got["BLEU-1"] == pytest.approx(math.exp(-2), rel=1e-8)
  assert got["BLEU-2"] == pytest.approx(math.exp(-2), rel=1e-8)
  got = _quiet({0: ["a b c", "a b c d e"]}, {0: "a b c x"})
  # c = 4 is 1 away from both references; the tie goes to the shorter (3), so
  # there is no penalty (the longer one would give 0.75 * exp(1 - 5/4)).
  assert got["BLEU-1"] == pytest.approx(0.75, rel=1e-8)


def test_cider_d_hand_computed(no_java):
  # Two videos, one reference each. Every n-gram weight is
  # w = log(2) - log(max(1, df)) = log 2, so the cosines only count n-grams.
  refs = {"a": ["a b c d"], "b": ["e f g h"]}
  got = _quiet(refs, {"a": "a b c d", "b": "e e e e"})
  # "a": identical, all four cosines 1 -> 10. "b": unigram e has tf 4; CIDEr-D
  # clips it to the reference weight: min(4w, w) * w / (|4w| * |2w|) = 1/8;
  # higher orders 0; equal lengths -> 10 * (1/8) / 4 = 0.3125. (Plain CIDEr,
  # without clipping, would give 10 * (4/8) / 4 = 1.25.)
  assert got["CIDEr-D"] == pytest.approx((10 + 0.3125) / 2, rel=1e-12)
  got = _quiet(refs, {"a": "a b c d", "b": "e f g"})
  # "b": cosines 3/(sqrt3*2), 2/(sqrt2*sqrt3), 1/(1*sqrt2), 0 and a Gaussian
  # length penalty exp(-(2 - 3)^2 / (2 * 6^2)) on the bigram counts 2 vs 3.
  b = 10 * (3 / (2 * math.sqrt(3)) + 2 / math.sqrt(6) + 1 / math.sqrt(2)) / 4 * math.exp(-1 / 72)
  assert got["CIDEr-D"] == pytest.approx((10 + b) / 2, rel=1e-12)


def test_corpus_bleu_matches_sacrebleu(no_java):
  refs = {0: ["a man is riding a horse on the beach", "someone rides a brown horse near the sea"],
          1: ["the chef slices an onion and adds salt", "a cook cuts onions on a wooden board"],
          2: ["two dogs play in the snow together", "a pair of dogs runs through the snow"],
          3: ["children are jumping into a pool", "the kids jump into the pool"]}
  hyps = {0: "a man rides a horse on the beach", 1: "the chef cuts an onion and adds some salt",
          2: "dogs play in the snow", 3: "the kids are jumping into a pool"}
  got = _quiet(refs, hyps)
  ids = list(hyps)
  for n in range(1, 5):
    ref = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none", max_ngram_order=n)
    expected = ref.corpus_score([hyps[i] for i in ids],
                                [[refs[i][j] for i in ids] for j in range(2)]).score / 100
    assert got[f"BLEU-{n}"] == pytest.approx(expected, rel=1e-7), n


def test_fallback_path_warns_and_skips_meteor(no_java):
  with pytest.warns(RuntimeWarning, match="METEOR is skipped"):
    got = captioning.caption_metrics(_REFS, _HYPS)
  assert set(got) == set(captioning.METRIC_NAMES) - {"METEOR"}
  assert all(isinstance(v, float) for v in got.values())


@pytest.mark.parametrize("text, expected", [
    ("The dog's ball, isn't it?", "the dog 's ball is n't it"),
    ('A chef (on TV) cuts 3.5 onions; then: "stirs" it...',
     "a chef -lrb- on tv -rrb- cuts 3.5 onions then stirs it"),
    ("1,000 people at 3:30, then U.S. army's tank.", "1,000 people at 3:30 then u.s. army 's tank"),
    ("He said, 'no'. Mr. Smith can't -- gonna go", "he said no mr. smith ca n't gon na go"),
    ("What?! cost $5 & 50% off", "what ?! cost $ 5 & 50 % off"),
])
def test_fallback_tokenize_hand_written(text, expected):
  # The expected strings are what pycocoevalcap's PTB tokenization gives.
  assert captioning.fallback_tokenize(text) == expected


@pytest.mark.parametrize("refs, hyps, message", [
    ({0: ["a"]}, {1: "a"}, "same ids"),
    ({0: ["a"], 1: ["b"]}, {0: "a"}, "same ids"),
    ({}, {}, "empty"),
    ({0: ["a"]}, {0: ""}, "hypothesis 0 is empty"),
    ({0: ["a"]}, {0: "  \n"}, "hypothesis 0 is empty"),
    ({0: ["a"]}, {0: ["a"]}, "must be one string"),
    ({0: "a cat"}, {0: "a"}, "non-empty list"),
    ({0: []}, {0: "a"}, "non-empty list"),
    ({0: ["a", " "]}, {0: "a"}, "empty or non-string"),
])
def test_bad_inputs_raise(refs, hyps, message):
  with pytest.raises(ValueError, match=message):
    captioning.caption_metrics(refs, hyps)


# ------------------------------------------------------------- Java (PTB, METEOR)

@needs_java
def test_perfect_captions_with_java():
  # Hypotheses equal one reference up to case, punctuation and a '\r' (which
  # would shift pycocoevalcap's line-aligned tokenizer output if passed on).
  refs = {0: ["A man rides a horse.", "Someone is riding."],
          1: ["Two dogs play in the snow!"],
          2: ["The chef slices an onion\r quickly."]}
  hyps = {0: "a man rides a horse", 1: "two dogs play in the snow",
          2: "the chef slices an onion quickly"}
  got = captioning.caption_metrics(refs, hyps)
  assert set(got) == set(captioning.METRIC_NAMES)
  for n in range(1, 5):
    assert got[f"BLEU-{n}"] == pytest.approx(1.0, abs=1e-9)
  assert got["METEOR"] == pytest.approx(1.0)
  assert got["ROUGE-L"] == 1.0
  # CIDEr-D averages over references: video 0 scores (10 + 0) / 2, since
  # "someone is riding" shares no n-gram with the hypothesis; the others 10.
  assert got["CIDEr-D"] == pytest.approx((5 + 10 + 10) / 3, rel=1e-12)


@needs_java
def test_java_path_matches_cocoevalcap_flow(monkeypatch):
  # Reference: what COCOEvalCap.evaluate does (PTB on gts and res separately,
  # then each scorer). METEOR is stubbed here (one JVM start saved); the slow
  # test below checks it.
  tokenizer = PTBTokenizer()
  gts = tokenizer.tokenize({k: [{"caption": c} for c in v] for k, v in _REFS.items()})
  res = tokenizer.tokenize({k: [{"caption": c}] for k, c in _HYPS.items()})
  seen = {}

  class FakeMeteor:
    def compute_score(self, g, r):
      seen.update(gts=g, res=r)
      return 0.5, []

  monkeypatch.setattr(captioning, "Meteor", FakeMeteor)
  got = captioning.caption_metrics(_REFS, _HYPS)
  assert seen == {"gts": gts, "res": res}
  bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
  assert [got[f"BLEU-{n}"] for n in range(1, 5)] == bleu
  assert got["ROUGE-L"] == Rouge().compute_score(gts, res)[0]
  assert got["CIDEr-D"] == Cider().compute_score(gts, res)[0]
  assert 0 < got["BLEU-4"] < got["BLEU-1"] < 1 and 0 < got["CIDEr-D"] < 10

  # The Java-free path gives the same numbers on these ordinary captions.
  monkeypatch.setattr(shutil, "which", lambda cmd, *a, **k: None)
  fallback = _quiet(_REFS, _HYPS)
  assert fallback == {k: v for k, v in got.items() if k != "METEOR"}


@needs_java
@pytest.mark.slow
def test_meteor_matches_pycocoevalcap():
  tokenizer = PTBTokenizer()
  gts = tokenizer.tokenize({k: [{"caption": c} for c in v] for k, v in _REFS.items()})
  res = tokenizer.tokenize({k: [{"caption": c}] for k, c in _HYPS.items()})
  expected = Meteor().compute_score(gts, res)[0]
  got = captioning.caption_metrics(_REFS, _HYPS)["METEOR"]
  assert got == expected and 0 < got < 1


@needs_java
def test_an_interrupted_meteor_call_ends_its_jvm_and_never_hangs_exit():
  """Ctrl-C inside pycocoevalcap's METEOR scorer leaves its lock held; Meteor.__del__
  takes that lock, so the interrupted process hung at exit (seen on a caption run
  stopped during its final evaluation). caption_metrics closes the scorer in a finally."""
  import threading  # pylint: disable=g-import-not-at-top
  meteor = Meteor()
  meteor.lock.acquire()  # what an interrupted _score / compute_score leaves behind
  captioning.close_meteor(meteor)
  assert meteor.meteor_p.poll() is not None  # the JVM is gone
  collected = threading.Thread(target=meteor.__del__, daemon=True)  # garbage collection
  collected.start()
  collected.join(10)
  assert not collected.is_alive(), "Meteor.__del__ waits on a lock nobody releases"
