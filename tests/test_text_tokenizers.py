"""Tests for avtext.text.tokenizers against hand-worked values and references.

References: a slow pure-Python WordPiece written from the BERT paper's
description, reading ids straight from vocab.txt.
"""
import pickle
import re
import subprocess
import sys
import textwrap
import unicodedata

import numpy as np
import pytest

from avtext.text import tokenizers


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
  tok = tokenizers.Tokenizer(bert_vocab_path)
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
  out = tokenizers.Tokenizer(bert_vocab_path)(texts)
  assert out["input_ids"].shape == (4, 32)
  for text, ids, mask in zip(texts, out["input_ids"], out["attention_mask"]):
    pieces = ["[CLS]"] + _ref_wordpieces(text, vocab) + ["[SEP]"]
    assert len(pieces) <= 32
    np.testing.assert_array_equal(ids[:len(pieces)], [vocab[p] for p in pieces])
    assert mask.sum() == len(pieces) and not ids[len(pieces):].any()
  assert "##board" in _ref_wordpieces("skateboarder", vocab)  # a real sub-word split


def test_same_ids_as_transformers_bert_tokenizer_fast(bert_vocab_path, tmp_path):
  """`bert_wordpiece` builds what transformers' BertTokenizerFast runs (the reference,
  without its seconds-long import): same ids, masks and word ids, cased and uncased,
  with accents, Chinese characters, control characters, special tokens written in the
  text, long words (WordPiece's 100-character limit -> [UNK]) and cropping."""
  import transformers  # pylint: disable=g-import-not-at-top
  texts = ["The skateboarder's tricks impressed everyone!",
           "Café crème, s'il vous plaît -- Ünïcödé ÀÉÎ two dogs chase a frisbee in 4K.",
           "一个男人在弹吉他 and a man plays 吉他", "tab\there\x00 null\u200b zero-width",
           "[CLS] a man [SEP] plays [MASK] guitar [PAD]", "x" * 120 + " word",
           " ".join(["antidisestablishmentarianism"] * 20), ""]
  for lowercase in (True, False):
    ref = transformers.BertTokenizerFast(vocab_file=str(bert_vocab_path),
                                         do_lower_case=lowercase)
    tok = tokenizers.Tokenizer(bert_vocab_path, max_len=24, lowercase=lowercase)
    ours = tok(texts, with_words=True)
    want = ref(texts, max_length=24, truncation=True, padding="max_length")
    np.testing.assert_array_equal(ours["input_ids"], want["input_ids"])
    np.testing.assert_array_equal(ours["attention_mask"], want["attention_mask"])
    for i in range(len(texts)):
      np.testing.assert_array_equal(
          ours["word_index"][i], [-1 if w is None else w for w in want.word_ids(i)])
      assert tok.wordpiece(texts[i]) == ref(texts[i], add_special_tokens=False)["input_ids"]


def test_crop_keeps_sep_last(bert_vocab_path):
  vocab = _read_vocab(bert_vocab_path)
  words = ("one two three four five six seven eight nine ten " * 4).split()
  out = tokenizers.Tokenizer(bert_vocab_path)(" ".join(words))
  expected = [101] + [vocab[w] for w in words[:30]] + [102]
  np.testing.assert_array_equal(out["input_ids"], expected)
  assert out["attention_mask"].all()


def test_tiny_vocab_by_hand(tmp_path):
  path = tmp_path / "vocab.txt"
  path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "man",
                             "play", "##ing", "."]) + "\n")
  tok = tokenizers.Tokenizer(path, max_len=8)
  np.testing.assert_array_equal(tok("A man playing.")["input_ids"], [2, 5, 6, 7, 8, 9, 3, 0])
  np.testing.assert_array_equal(tok(["A man playing."])["input_ids"],
                                [[2, 5, 6, 7, 8, 9, 3, 0]])
  np.testing.assert_array_equal(
      tokenizers.Tokenizer(path, max_len=5)("a man playing dog")["input_ids"],
      [2, 5, 6, 7, 3])  # cropped: [CLS] a man play [SEP]
  np.testing.assert_array_equal(tok("a dog")["input_ids"], [2, 5, 1, 3, 0, 0, 0, 0])


def test_missing_vocab_names_the_path(tmp_path):
  missing = tmp_path / "nope" / "vocab.txt"
  with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
    tokenizers.Tokenizer(missing)
  with pytest.raises(ValueError, match="max_len"):
    tokenizers.Tokenizer(max_len=1)


def test_tokenizer_pickles_before_and_after_use(bert_vocab_path):
  tok = tokenizers.Tokenizer(bert_vocab_path)
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

  Run in a fresh interpreter: the tokenizer must not need transformers (whose lazy
  module import used to fail in all but one thread, and takes seconds).
  """
  script = textwrap.dedent(f"""
      import sys, threading
      from avtext.text import tokenizers
      tok = tokenizers.Tokenizer({str(bert_vocab_path)!r}, max_len=8)
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
      assert "transformers" not in sys.modules
      print(len(out), len(set(map(tuple, out))), errors[:1])
      """)
  run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=300, check=False)
  assert run.returncode == 0, run.stderr[-2000:]
  assert run.stdout.split()[:2] == ["8", "1"], run.stdout
