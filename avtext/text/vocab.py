"""TVCaption's word-level vocabulary (MMT): `word_tokenize` and `WordVocab`."""
import json
import pathlib
import re
from typing import Sequence

import numpy as np

from avtext import atomic
from avtext import errors

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")


def word_tokenize(text: str) -> list[str]:
  """Lowercased words as TVCaption tokenizes (`nltk.word_tokenize(text.lower())`).

  nltk's word_tokenize first splits sentences with the Punkt model, a data
  download; here sentences end at '.', '!' or '?' followed by whitespace (no
  abbreviation list), then each goes through the same Treebank-style
  `NLTKWordTokenizer`, so "keys. I can't" gives keys . i ca n't.
  """
  from nltk.tokenize import NLTKWordTokenizer  # pylint: disable=g-import-not-at-top
  tok = NLTKWordTokenizer()
  return [w for sent in _SENTENCE_END.split(text.lower().strip()) if sent
          for w in tok.tokenize(sent)]


class WordVocab:
  """TVCaption's word vocabulary: {word: id} with 7 special tokens at fixed ids.

      [PAD] 0  [CLS] 1  [SEP] 2  [VID] 3  [BOS] 4  [EOS] 5  [UNK] 6

  `build` keeps the words of the training captions seen more than
  `min_count` times (official build_vocab.py: min_word_count 5, so >= 6),
  ordered by count (then alphabetically; the official order is Python-2
  dict order). Files are the official `word2idx` JSON ({word: id}), so an
  official `tvc_word2idx.json` loads as is.

  `encode(text, max_len)`: [BOS] w_1 .. w_k [EOS] [PAD].., k <= max_len - 2,
  unknown words -> [UNK]; `caption(text, max_len)` turns that into
  teacher-forcing fields: input_ids = ids[:-1], target_ids = ids[1:] (the
  official labels, a left shift), target_mask = 1 up to the EOS.
  """
  SPECIAL = ("[PAD]", "[CLS]", "[SEP]", "[VID]", "[BOS]", "[EOS]", "[UNK]")
  PAD, CLS, SEP, VID, BOS, EOS, UNK = range(7)

  def __init__(self, word2idx: dict[str, int], *, where: str = "word2idx"):
    for i, token in enumerate(self.SPECIAL):
      if word2idx.get(token) != i:
        raise ValueError(f"{where}: {token} must have id {i} (TVCaption's special tokens), "
                         f"got {word2idx.get(token)}")
    ids = sorted(word2idx.values())
    if ids != list(range(len(ids))):
      raise ValueError(f"{where}: ids must be 0..{len(ids) - 1} without gaps or repeats")
    self.word2idx = dict(word2idx)
    self.idx2word = {i: w for w, i in word2idx.items()}

  def __len__(self) -> int:
    return len(self.word2idx)

  @classmethod
  def build(cls, texts, min_count: int = 5) -> "WordVocab":
    counts: dict[str, int] = {}
    for text in texts:
      for w in word_tokenize(text):
        counts[w] = counts.get(w, 0) + 1
    words = sorted((w for w, c in counts.items() if c > min_count and w not in cls.SPECIAL),
                   key=lambda w: (-counts[w], w))
    return cls({**{t: i for i, t in enumerate(cls.SPECIAL)},
                **{w: i + len(cls.SPECIAL) for i, w in enumerate(words)}})

  @classmethod
  def load(cls, path: str | pathlib.Path) -> "WordVocab":
    if not pathlib.Path(path).expanduser().is_file():
      raise errors.InputNotFound(f"{path}: no such file; expected a word2idx JSON (TVCaption's "
                                 "tvc_word2idx.json or python -m avtext.tools.caption_vocab)")
    try:
      word2idx = json.loads(pathlib.Path(path).expanduser().read_text())
    except (OSError, ValueError) as e:
      raise ValueError(f"{path}: expected a word2idx JSON {{word: id}} (TVCaption's "
                       f"tvc_word2idx.json or python -m avtext.tools.caption_vocab): {e}") from e
    if not isinstance(word2idx, dict):
      raise ValueError(f"{path}: expected a JSON object {{word: id}}")
    return cls(word2idx, where=str(path))

  def save(self, path: str | pathlib.Path) -> None:
    atomic.write_json(path, self.word2idx)

  def encode(self, text: str, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids int32 [max_len], mask int32 [max_len]) of [BOS] words [EOS] [PAD].."""
    if max_len < 2:
      raise ValueError(f"max_len must be >= 2 ([BOS] + [EOS]), got {max_len}")
    words = word_tokenize(text)[:max_len - 2]
    seq = [self.BOS] + [self.word2idx.get(w, self.UNK) for w in words] + [self.EOS]
    ids = np.full(max_len, self.PAD, np.int32)
    ids[:len(seq)] = seq
    mask = np.zeros(max_len, np.int32)
    mask[:len(seq)] = 1
    return ids, mask

  def caption(self, text: str, max_len: int) -> dict[str, np.ndarray]:
    """{'input_ids', 'target_ids', 'target_mask'}: int32 [max_len - 1] each."""
    ids, mask = self.encode(text, max_len)
    return {"input_ids": ids[:-1], "target_ids": ids[1:], "target_mask": mask[1:]}

  def decode(self, ids: Sequence[int]) -> str:
    """Words up to the first [EOS]; a leading [BOS] and [PAD]s dropped (official rule)."""
    ids = [int(i) for i in ids]
    if ids and ids[0] == self.BOS:
      ids = ids[1:]
    if self.EOS in ids:
      ids = ids[:ids.index(self.EOS)]
    return " ".join(self.idx2word.get(i, self.SPECIAL[self.UNK]) for i in ids if i != self.PAD)
