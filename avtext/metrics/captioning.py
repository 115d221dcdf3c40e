"""Captioning metrics: BLEU-1..4, METEOR, ROUGE-L and CIDEr-D.

The numbers are those of the COCO caption evaluation (pycocoevalcap 1.2),
which COOT (Sec. 4.4, Tables 4-5: B@3/4, RougeL, METEOR, CIDEr-D) and VideoCC
(Sec. 5.1: B-4, C, M) report:

- Text is tokenized with the Stanford PTBTokenizer (lowercased, then the COCO
  punctuation list dropped), as `COCOEvalCap.evaluate` does.
- BLEU-n is corpus-level: n-gram counts clipped per caption and summed over the
  corpus, geometric mean of 1..n precisions, brevity penalty exp(1 - r/c) with
  r the summed "closest" reference lengths (ties go to the shorter reference).
- METEOR 1.5 (jar shipped with pycocoevalcap, `-l en -norm`), corpus score
  from the aggregated statistics, not the mean of per-caption scores.
- ROUGE-L: mean over captions of the LCS F-measure (beta = 1.2) against the
  reference with the best precision and recall.
- CIDEr-D: pycocoevalcap's `Cider` class *is* CIDEr-D (Vedantam et al. 2015),
  not the original CIDEr: it clips each hypothesis n-gram tf-idf weight by
  the reference weight, multiplies by the Gaussian length penalty
  exp(-(l_h - l_r)^2 / (2 * 6^2)), scales by 10 and uses no stemming. The idf
  comes from the references of the evaluated set itself, so the score depends
  on the corpus and a single caption always gets 0. (Its lengths l are
  bigram counts, one less than the word counts of non-empty captions.)

Scores are on pycocoevalcap's scale: fractions in [0, 1], CIDEr-D in [0, 10];
papers usually print them times 100.

The tokenizer and METEOR run on Java. Without `java` on the PATH, METEOR is
left out of the result with a warning, and text goes through
`fallback_tokenize`, a pure-Python approximation of the PTB tokenization, so
BLEU / ROUGE-L / CIDEr-D may then differ slightly from the Java path on
unusual punctuation.
"""
import re
import shutil
import warnings
from collections.abc import Hashable, Mapping, Sequence

from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.meteor.meteor import Meteor
from pycocoevalcap.rouge.rouge import Rouge
from pycocoevalcap.tokenizer.ptbtokenizer import PUNCTUATIONS, PTBTokenizer

METRIC_NAMES = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr-D")

# How PTBTokenizer writes these, after its -lowerCase (which is why the COCO
# punctuation filter, written in upper case, never removes brackets).
_PTB_SPELLING = {"(": "-lrb-", ")": "-rrb-", "[": "-lsb-", "]": "-rsb-", "{": "-lcb-",
                 "}": "-rcb-", '"': "''"}
_ALWAYS_SPLIT = re.compile(
    r"""(\.\.\.|--|[?!]+|[;"`()\[\]{}$%&+=*^~|]|(?<!\d)[:,]|[:,](?!\d))""")
_CLITIC = re.compile(r"^(.+?)(n't|'s|'m|'d|'ll|'re|'ve)$")
_CLITICS = frozenset({"n't", "'s", "'m", "'d", "'ll", "'re", "'ve"})
_SPLIT_WORDS = {"cannot": ("can", "not"), "gonna": ("gon", "na"), "gotta": ("got", "ta"),
                "wanna": ("wan", "na")}
_ACRONYM = re.compile(r"^([a-z]\.)+$")  # u.s., a.m.: PTB keeps their final period.
_ABBREVIATIONS = frozenset({"mr.", "mrs.", "ms.", "dr.", "st.", "jr.", "sr.", "vs.", "etc."})


def _split_word(piece: str) -> list[str]:
  """Quotes, clitics and a sentence-final period of one punctuation-free piece."""
  if piece in _CLITICS:
    return [piece]
  if piece in _SPLIT_WORDS:
    return list(_SPLIT_WORDS[piece])
  head, tail = [], []
  while len(piece) > 1 and piece.startswith("'"):
    head.append("'")
    piece = piece[1:]
  while len(piece) > 1:
    if piece.endswith("'"):
      tail.insert(0, "'")
    elif piece.endswith(".") and not _ACRONYM.match(piece) and piece not in _ABBREVIATIONS:
      tail.insert(0, ".")
    else:
      break
    piece = piece[:-1]
  clitic = _CLITIC.match(piece)
  return head + (list(clitic.groups()) if clitic else [piece]) + tail


def close_meteor(meteor: "Meteor") -> None:
  """Ends pycocoevalcap's METEOR JVM. A call interrupted inside the scorer (Ctrl-C,
  SIGTERM) leaves its lock held, and `Meteor.__del__` takes that lock: at exit the
  process would wait on it forever. Released here first; `__del__` is then a no-op."""
  lock = getattr(meteor, "lock", None)
  if lock is not None and lock.locked():
    lock.release()
  end = getattr(meteor, "__del__", None)
  if end is not None:
    end()  # closes stdin, kills and reaps the JVM (again at collection: harmless)


def fallback_tokenize(text: str) -> str:
  """Pure-Python stand-in for pycocoevalcap's PTB tokenization (no Java).

  Lowercases; splits off punctuation (commas and colons only outside
  numbers), clitics ("is n't", "dog 's"), quotes and a final period (kept
  on acronyms and common abbreviations); writes brackets and double quotes
  as PTB does ("-lrb-", "''"); then drops the tokens of pycocoevalcap's punctuation list.
  Agrees with the Java tokenizer on ordinary captions (see the tests), not
  on every corner of the PTB rules.
  """
  tokens = []
  for word in text.lower().split():
    for piece in _ALWAYS_SPLIT.split(word):
      if not piece:
        continue
      if _ALWAYS_SPLIT.fullmatch(piece):
        tokens.append(_PTB_SPELLING.get(piece, piece))
      else:
        tokens.extend(_split_word(piece))
  return " ".join(t for t in tokens if t not in PUNCTUATIONS)


def _ptb_tokenize(texts: Mapping[Hashable, Sequence[str]]) -> dict[Hashable, list[str]]:
  # One JVM call for all texts. Every kind of line break becomes a space
  # first: the Java tokenizer keeps lines aligned only on '\n'.
  captions = {key: [{"caption": " ".join(t.split())} for t in values]
              for key, values in texts.items()}
  return PTBTokenizer().tokenize(captions)


def _validate(references: Mapping[Hashable, Sequence[str]],
              hypotheses: Mapping[Hashable, str]) -> None:
  missing, extra = references.keys() - hypotheses.keys(), hypotheses.keys() - references.keys()
  if missing or extra:
    raise ValueError(
        f"references and hypotheses must have the same ids: {len(missing)} ids without a "
        f"hypothesis (e.g. {sorted(missing, key=str)[:5]}), {len(extra)} without references "
        f"(e.g. {sorted(extra, key=str)[:5]})")
  if not hypotheses:
    raise ValueError("no captions to evaluate: references and hypotheses are empty")
  for key, hyp in hypotheses.items():
    if not isinstance(hyp, str):
      raise ValueError(f"hypothesis {key!r} must be one string; got {type(hyp).__name__}")
    if not hyp.strip():
      raise ValueError(f"hypothesis {key!r} is empty; every id needs a non-empty caption")
  for key, refs in references.items():
    if isinstance(refs, str) or not refs:
      raise ValueError(f"references of {key!r} must be a non-empty list of strings; got {refs!r}")
    if not all(isinstance(r, str) and r.strip() for r in refs):
      raise ValueError(f"references of {key!r} contain an empty or non-string caption: {refs!r}")


def caption_metrics(references: Mapping[Hashable, Sequence[str]],
                    hypotheses: Mapping[Hashable, str]) -> dict[str, float]:
  """BLEU-1..4, METEOR, ROUGE-L and CIDEr-D of a captioning corpus (COOT Table 4).

  Args:
    references: id -> reference captions (raw text), at least one per id.
    hypotheses: id -> the generated caption (raw text), same ids.

  Returns:
    {"BLEU-1": ..., "BLEU-2": ..., "BLEU-3": ..., "BLEU-4": ..., "METEOR": ...,
    "ROUGE-L": ..., "CIDEr-D": ...} as plain floats on pycocoevalcap's scale;
    "METEOR" is absent when Java is not available.

  Raises:
    ValueError: the ids differ, a hypothesis is empty, or an id has no
      (or an empty) reference.
  """
  _validate(references, hypotheses)
  ids = list(hypotheses)
  have_java = shutil.which("java") is not None
  if have_java:
    tokenized = _ptb_tokenize({**{("ref", k): references[k] for k in ids},
                               **{("hyp", k): [hypotheses[k]] for k in ids}})
    gts = {k: tokenized[("ref", k)] for k in ids}
    res = {k: tokenized[("hyp", k)] for k in ids}
  else:
    warnings.warn("java not found on PATH: METEOR is skipped and captions are tokenized with "
                  "avtext.metrics.captioning.fallback_tokenize instead of the Java PTB "
                  "tokenizer; install a JRE for the reference numbers", RuntimeWarning)
    gts = {k: [fallback_tokenize(r) for r in references[k]] for k in ids}
    res = {k: [fallback_tokenize(hypotheses[k])] for k in ids}

  bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
  scores = {f"BLEU-{n}": float(b) for n, b in enumerate(bleu, start=1)}
  if have_java:
    meteor = Meteor()
    try:
      # "|||" separates fields in the METEOR protocol; pycocoevalcap strips it
      # from hypotheses only.
      scores["METEOR"] = float(meteor.compute_score(
          {k: [r.replace("|||", "") for r in v] for k, v in gts.items()}, res)[0])
    finally:
      close_meteor(meteor)  # the JVM ends now, also when the call was interrupted
  scores["ROUGE-L"] = float(Rouge().compute_score(gts, res)[0])
  scores["CIDEr-D"] = float(Cider().compute_score(gts, res)[0])
  return scores
