"""A local BERT-family model as a frozen per-token text encoder: the one engine behind
every text-feature tool and XML's free-text queries.

`TextEncoder(bert_dir, layers)` loads an HF BERT directory (config.json,
model.safetensors, vocab.txt; default the offline MiniLM-L6) into our `Bert`
and its WordPiece tokenizer (lower-cased unless tokenizer_config.json says
do_lower_case=false); `run({key: token ids})` returns {key: float32
[tokens, len(layers) * D]}, the concatenated hidden states `layers` (HF
numbering: 0 the embeddings, -1 the last layer) of each sequence, batched by
length; `token_features({key: text}, max_len)` the same for plain sentences,
"[CLS] text [SEP]" cut to `max_len` tokens, with [CLS] and [SEP] taken off again.
COOT's paragraphs (`avtext.features.coot_text`), TVR's queries and subtitles
(`avtext.features.tvr_text`) and the XML task's `encode_text` are built on it.
"""
import pathlib
from typing import Mapping, Sequence

import numpy as np


def _lowercase(directory: pathlib.Path) -> bool:
  import json  # pylint: disable=g-import-not-at-top
  config = directory / "tokenizer_config.json"
  if config.is_file():
    try:
      return bool(json.loads(config.read_text()).get("do_lower_case", True))
    except ValueError as e:
      raise ValueError(f"{config}: not JSON ({e})") from e
  return True


class TextEncoder:
  """A local BERT with its tokenizer; see the module docstring."""

  def __init__(self, bert_dir=None, layers: Sequence[int] = (-2, -1)):
    from avtext.models import bert as bert_model  # pylint: disable=g-import-not-at-top
    from avtext.text import tokenizers  # pylint: disable=g-import-not-at-top
    from avtext import assets  # pylint: disable=g-import-not-at-top
    from avtext.weights import bert as bert_weights  # pylint: disable=g-import-not-at-top

    self.directory = pathlib.Path(bert_dir) if bert_dir else assets.minilm_l6_dir()
    kwargs, self.params = bert_weights.load_hf_bert(self.directory)
    self.max_len = kwargs["max_position_embeddings"]
    num_states = kwargs["num_layers"] + 1
    bad = [layer for layer in layers if not -num_states <= layer < num_states]
    if not layers or bad:
      raise ValueError(f"layers={tuple(layers)}: {self.directory} has {num_states} hidden "
                       f"states (embeddings + {kwargs['num_layers']} layers); use indices in "
                       f"[{-num_states}, {num_states - 1}]")
    self.layers = tuple(layers)
    self.dim = kwargs["hidden_size"] * len(self.layers)
    self.model = bert_model.Bert(**kwargs)
    vocab = self.directory / "vocab.txt"
    if not vocab.is_file():
      raise FileNotFoundError(f"{vocab} not found: the WordPiece vocabulary of {self.directory}")
    self.tokenizer = tokenizers.Tokenizer(vocab, lowercase=_lowercase(self.directory))
    self._fn = None

  def sentence_ids(self, text: str, max_len: int) -> list[int]:
    """[CLS] wordpieces [SEP], the wordpieces cut to fit `max_len` tokens."""
    cls_sep = self.tokenizer.wordpiece("[CLS] [SEP]")
    pieces = self.tokenizer.wordpiece(text)[:max(0, min(max_len, self.max_len) - 2)]
    return cls_sep[:1] + pieces + cls_sep[1:]

  def token_features(self, texts: Mapping[str, str], max_len: int, *, batch_size: int = 16,
                     desc: str = "text features") -> dict[str, np.ndarray]:
    """{key: float32 [tokens, dim]}: each text as "[CLS] text [SEP]" cut to `max_len`
    tokens (`sentence_ids`), through `run`, without its [CLS] and [SEP] rows (an empty
    text keeps both, so no sequence is empty)."""
    ids = {k: self.sentence_ids(t, max_len) for k, t in texts.items()}
    feats = self.run(ids, batch_size=batch_size, desc=desc)
    return {k: v[1:-1] if len(v) > 2 else v for k, v in feats.items()}

  def run(self, token_ids: Mapping[str, Sequence[int]], *, batch_size: int = 16,
          desc: str = "text features") -> dict[str, np.ndarray]:
    """{key: float32 [len(ids), dim]} for every key (sequences longer than the model's
    positions are an error: cut them first)."""
    import jax  # pylint: disable=g-import-not-at-top
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top

    too_long = [k for k, ids in token_ids.items() if len(ids) > self.max_len]
    if too_long:
      raise ValueError(f"{len(too_long)} sequences exceed {self.directory}'s {self.max_len} "
                       f"positions, e.g. {too_long[:3]}")
    empty = [k for k, ids in token_ids.items() if not len(ids)]
    if empty:
      raise ValueError(f"{len(empty)} empty token sequences, e.g. {empty[:3]}")
    if self._fn is None:
      model, params, layers = self.model, self.params, self.layers

      @jax.jit
      def fn(ids, mask):
        states = model.apply({"params": params}, ids, mask, hidden_states=True)["hidden_states"]
        return jnp.concatenate([states[i] for i in layers], axis=-1)
      self._fn = fn

    # Similar lengths share a batch; widths are rounded up to 16 to bound recompilation.
    order = sorted(token_ids, key=lambda k: len(token_ids[k]))
    features = {}
    # The features are stored in float32: no reduced-precision matmuls (TPU/GPU defaults).
    with jax.default_matmul_precision("highest"):
      for start in tqdm(range(0, len(order), batch_size), desc=desc, unit="batch"):
        chunk = order[start:start + batch_size]
        width = min(-(-len(token_ids[chunk[-1]]) // 16) * 16, self.max_len)
        ids = np.zeros((batch_size, width), np.int32)
        mask = np.zeros((batch_size, width), np.int32)
        mask[len(chunk):, 0] = 1  # filler rows attend to one token (no all-masked softmax)
        for row, key in enumerate(chunk):
          ids[row, :len(token_ids[key])] = token_ids[key]
          mask[row, :len(token_ids[key])] = 1
        out = np.asarray(self._fn(ids, mask))
        for row, key in enumerate(chunk):
          features[key] = out[row, :len(token_ids[key])].astype(np.float32)
    return {k: features[k] for k in token_ids}
