r"""COOT text features of a dataset's meta file (the official precompute_text.py).

    python -m avtext.features coot_text --dataset_dir=/data/coot/activitynet \
        [--metadata_name=all] [--bert_dir=/models/bert-base-uncased] [--layers=-2,-1] \
        [--name=<output name>] [--batch_size=16] [--force]

Reads `<dataset_dir>/meta_<metadata_name>.json` (every split), turns each
key's segment texts into COOT's "bert_paper" paragraph, runs our `Bert` with
the weights in `--bert_dir` (a local HF BERT-family directory: config.json,
model.safetensors, vocab.txt; default the offline MiniLM-L6) and writes the
per-token concatenation of the `--layers` hidden states (float32) to
`<dataset_dir>/<name>.h5` and the tokens per sentence to
`<name>_sentence_splits.json` (`encode_paragraphs`; layout in
avtext/data/coot_files.py). The default name is the official one,
`text_feat_<dataset dir name>_meta_<metadata_name>_transformers_<model dir
name>_<layers>`, so with a `bert-base-uncased` directory the configs'
`dataset.text_features` find it (1536-d); MiniLM-L6 gives
`..._transformers_minilm-l6_-2,-1` (768-d). Existing features are kept unless
`--force`.

The paragraph is COOT's "bert_paper" text (nntrainer/data_text.py), one string
per sentence (`bert_paper_sentences`): whitespace collapsed, one trailing dot
removed ("..." is kept), an inner ". " turned into a "[SEP]", "[CLS]" before
the first sentence and "[SEP]" after each; no lower-casing (the uncased
WordPiece does it). Each string is tokenized on its own (no special tokens
added), so [CLS] counts to sentence 1 and every sentence ends in [SEP]; the
paragraph's tokens are their concatenation and go through BERT at once.
"""
import pathlib
import re
import sys
from typing import Mapping, Sequence

from absl import flags
from absl import logging
import numpy as np

from avtext import cli
from avtext import errors

from avtext.data import coot_files
from avtext.train import rundir
from avtext.weights import bert_encoder

MINILM_NAME = "minilm-l6"
CLS, SEP = "[CLS]", "[SEP]"
MIN_CUT = 5  # precompute_text.py: a sentence cut to fit max_len keeps >= 5 tokens

_WHITESPACE = re.compile(r"\s+")


def bert_paper_sentences(sentences: Sequence[str]) -> list[str]:
  """COOT's "bert_paper" preprocessing (nntrainer/data_text.py), one string per sentence.

  "A man  walks.", "He sits. Then he leaves." ->
  "[CLS] A man walks [SEP]", "He sits [SEP] Then he leaves [SEP]".
  """
  out = []
  for i, sentence in enumerate(sentences):
    s = _WHITESPACE.sub(" ", str(sentence)).strip()
    if not s:
      raise ValueError(f"sentence {i} of the paragraph is empty: {sentence!r}")
    if s[-1] == "." and len(s) > 1 and s[-2] != ".":
      s = s[:-1]
    s = s.strip().replace(". ", f" {SEP} ")
    words = [w for w in s.split(" ") if w.strip()]
    out.append(" ".join(([CLS] if i == 0 else []) + words + [SEP]))
  return out


def bert_paper_paragraph(sentences: Sequence[str]) -> str:
  """The whole "bert_paper" paragraph: `bert_paper_sentences` joined by spaces."""
  return " ".join(bert_paper_sentences(sentences))


def cut_to_length(pieces: list[list[int]], max_len: int, key: str) -> list[list[int]]:
  """precompute_text.py's cut of a paragraph longer than `max_len` tokens.

  From the last sentence backwards, each is given the length n = max(MIN_CUT,
  its length - what is still too much) and keeps its first n - 1 tokens and
  its last ([SEP]). As there, a sentence shorter than MIN_CUT that is reached
  keeps all its tokens plus a repeated last one.
  """
  lengths = [len(p) for p in pieces]
  for i in reversed(range(len(pieces))):
    overshoot = sum(lengths) - max_len
    if overshoot <= 0:
      break
    lengths[i] = max(MIN_CUT, len(pieces[i]) - overshoot)
  out = [p if n == len(p) else p[:n - 1] + p[-1:] for p, n in zip(pieces, lengths)]
  if sum(map(len, out)) > max_len:
    raise ValueError(f"paragraph {key!r}: its {len(pieces)} sentences do not fit "
                     f"max_len={max_len} tokens even when cut to {MIN_CUT} tokens each")
  return out


def encode_paragraphs(paragraphs: Mapping[str, Sequence[str]], *, bert_dir=None,
                      layers: Sequence[int] = (-2, -1), batch_size: int = 16,
                      max_len: int = 512) -> tuple[dict[str, np.ndarray], dict[str, list[int]]]:
  """COOT's text features (precompute_text.py) computed with our `Bert`.

  Each paragraph (a list of sentences) becomes its "bert_paper" tokens
  (`bert_paper_sentences`, WordPiece of `bert_dir`'s vocab.txt, lower-cased
  unless its tokenizer_config.json says do_lower_case=false), goes through
  BERT in one sequence, and each token's hidden states of `layers` (HF
  numbering: 0 the embeddings, -1 the last layer) are concatenated.
  Paragraphs over `max_len` tokens are cut as the official script does by
  default (`cut_to_length`, logged), not strided.

  Args:
    paragraphs: {key: sentences}.
    bert_dir: an HF BERT-family directory (config.json, model.safetensors,
      vocab.txt); None = the offline MiniLM-L6 (2 x 384 = 768-d with the
      default layers; bert-base-uncased gives 1536).
    layers: hidden-state indices to concatenate.
    batch_size: paragraphs per forward pass (similar lengths are batched).
    max_len: most tokens per paragraph; the model's max_position_embeddings
      if that is less (the official script's limit).

  Returns:
    ({key: float32 [tokens, len(layers) * D]}, {key: tokens per sentence}).
  """
  encoder = bert_encoder.TextEncoder(bert_dir, layers)
  max_len = min(max_len, encoder.max_len)
  tokenizer = encoder.tokenizer

  token_ids, lengths, cut = {}, {}, []
  for key, sentences in paragraphs.items():
    try:
      pieces = [tokenizer.wordpiece(s) for s in bert_paper_sentences(sentences)]
    except ValueError as e:
      raise ValueError(f"paragraph {key!r}: {e}") from e
    if sum(map(len, pieces)) > max_len:
      pieces = cut_to_length(pieces, max_len, key)
      cut.append(key)
    lengths[key] = [len(p) for p in pieces]
    token_ids[key] = [i for p in pieces for i in p]
  if cut:
    logging.warning("%d paragraphs longer than %d tokens were cut as COOT's precompute_text.py "
                    "does, e.g. %s", len(cut), max_len, cut[:3])

  features = encoder.run(token_ids, batch_size=batch_size)
  return {k: features[k] for k in paragraphs}, lengths


def parse_layers(text: str) -> tuple[int, ...]:
  try:
    return tuple(int(x) for x in text.split(","))
  except ValueError as e:
    raise errors.BadInput(
        f"--layers={text!r}: expected comma-separated integers, e.g. -2,-1") from e


def default_name(dataset_dir, metadata_name: str, bert_dir: str | None,
                 layers: Sequence[int]) -> str:
  """precompute_text.py's `text_feat_<dataset>_meta_<metadata>_transformers_<model>_<layers>`."""
  model = pathlib.Path(bert_dir).name if bert_dir else MINILM_NAME
  return (f"text_feat_{pathlib.Path(dataset_dir).resolve().name}_meta_{metadata_name}_"
          f"transformers_{model}_{','.join(str(layer) for layer in layers)}")


def precompute(dataset_dir, *, metadata_name: str = "all", bert_dir: str | None = None,
               layers: Sequence[int] = (-2, -1), name: str | None = None, batch_size: int = 16,
               force: bool = False) -> pathlib.Path:
  """Writes the text features of every key of the meta file; returns the .h5 path."""
  directory = pathlib.Path(dataset_dir)
  meta_file = coot_files.meta_path(directory, metadata_name)
  if not meta_file.is_file():
    raise errors.InputNotFound(f"{meta_file} not found: the COOT meta file (segments and their "
                            "texts; COOT's data_read_activitynet_meta.py / "
                            "data_read_youcook2_meta.py write it)")
  name = name or default_name(directory, metadata_name, bert_dir, layers)
  out = coot_files.text_h5_path(directory, name)
  if out.is_file() and coot_files.sentence_splits_path(directory, name).is_file() and not force:
    logging.info("%s exists; nothing to do (--force overwrites)", out)
    return out
  meta = coot_files.read_json(meta_file, "COOT meta file")
  for key, entry in meta.items():
    coot_files.check_meta_entry(meta_file, key, entry)
  paragraphs = {key: [seg["text"] for seg in entry["segments"]] for key, entry in meta.items()}
  features, lengths = encode_paragraphs(
      paragraphs, bert_dir=bert_dir, layers=layers, batch_size=batch_size)
  coot_files.write_text_features(directory, name, features, lengths)
  dim = next(iter(features.values())).shape[1] if features else 0
  logging.info("wrote %s and its sentence splits: %d paragraphs, %d-d (config.dataset."
               "text_features=%r, text_dim=%d)", out, len(features), dim, name, dim)
  return out


FLAGS = flags.FlagValues()
_DATASET_DIR = cli.DEFINE_path("dataset_dir", None, "the COOT dataset directory (holds "
                               "meta_<metadata_name>.json)", flag_values=FLAGS)
_METADATA_NAME = flags.DEFINE_string("metadata_name", "all", "reads "
                                     "meta_<metadata_name>.json", flag_values=FLAGS)
_BERT_DIR = cli.DEFINE_path("bert_dir", None, "a local HF BERT directory (default: the "
                            "offline MiniLM-L6)", flag_values=FLAGS)
_LAYERS = flags.DEFINE_string("layers", "-2,-1", "hidden states to concatenate (HF "
                              "numbering, -1 = the last layer)", flag_values=FLAGS)
_NAME = flags.DEFINE_string("name", None, "output name (default: the official naming)",
                            flag_values=FLAGS)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 16, "paragraphs per forward pass",
                                   lower_bound=1, flag_values=FLAGS)
_FORCE = flags.DEFINE_bool("force", False, "overwrite existing features", flag_values=FLAGS)
flags.mark_flag_as_required("dataset_dir", flag_values=FLAGS)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise errors.BadInput(f"unexpected arguments {list(argv[1:])}; see --help")
  cli.log_progress()
  cli.check_input_dir("dataset_dir", _DATASET_DIR.value, "COOT dataset directory")
  with rundir.output_lock(_DATASET_DIR.value, "dataset_dir"):
    print(precompute(_DATASET_DIR.value, metadata_name=_METADATA_NAME.value,
                     bert_dir=_BERT_DIR.value, layers=parse_layers(_LAYERS.value),
                     name=_NAME.value, batch_size=_BATCH_SIZE.value, force=_FORCE.value))


if __name__ == "__main__":  # python -m avtext.features.coot_text: as python -m avtext.features coot_text
  cli.run(main, FLAGS, [f"python -m avtext.features coot_text"] + sys.argv[1:], doc=__doc__)
