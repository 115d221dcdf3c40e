r"""COOT text features of a dataset's meta file (the official precompute_text.py).

    python -m avtext.tools.precompute_text_features --dataset_dir=/data/coot/activitynet \
        [--metadata_name=all] [--bert_dir=/models/bert-base-uncased] [--layers=-2,-1] \
        [--name=<output name>] [--batch_size=16] [--force]

Reads `<dataset_dir>/meta_<metadata_name>.json` (every split), turns each
key's segment texts into COOT's "bert_paper" paragraph, runs our `Bert` with
the weights in `--bert_dir` (a local HF BERT-family directory: config.json,
model.safetensors, vocab.txt; default the offline MiniLM-L6) and writes the
per-token concatenation of the `--layers` hidden states (float32) to
`<dataset_dir>/<name>.h5` and the tokens per sentence to
`<name>_sentence_splits.json` (`avtext.data.coot_layout.encode_paragraphs`;
layout in avtext/data/coot_layout.py). The default name is the official one,
`text_feat_<dataset dir name>_meta_<metadata_name>_transformers_<model dir
name>_<layers>`, so with a `bert-base-uncased` directory the configs'
`dataset.text_features` find it (1536-d); MiniLM-L6 gives
`..._transformers_minilm-l6_-2,-1` (768-d). Existing features are kept unless
`--force`.
"""
import argparse
import pathlib
from typing import Sequence

from absl import logging

from avtext.data import coot_layout

MINILM_NAME = "minilm-l6"


def parse_layers(text: str) -> tuple[int, ...]:
  try:
    return tuple(int(x) for x in text.split(","))
  except ValueError as e:
    raise argparse.ArgumentTypeError(
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
  meta_file = coot_layout.meta_path(directory, metadata_name)
  if not meta_file.is_file():
    raise FileNotFoundError(f"{meta_file} not found: the COOT meta file (segments and their "
                            "texts; COOT's data_read_activitynet_meta.py / "
                            "data_read_youcook2_meta.py write it)")
  name = name or default_name(directory, metadata_name, bert_dir, layers)
  out = coot_layout.text_h5_path(directory, name)
  if out.is_file() and coot_layout.sentence_splits_path(directory, name).is_file() and not force:
    logging.info("%s exists; nothing to do (--force overwrites)", out)
    return out
  meta = coot_layout.read_json(meta_file, "COOT meta file")
  for key, entry in meta.items():
    coot_layout.check_meta_entry(meta_file, key, entry)
  paragraphs = {key: [seg["text"] for seg in entry["segments"]] for key, entry in meta.items()}
  features, lengths = coot_layout.encode_paragraphs(
      paragraphs, bert_dir=bert_dir, layers=layers, batch_size=batch_size)
  coot_layout.write_text_features(directory, name, features, lengths)
  dim = next(iter(features.values())).shape[1] if features else 0
  logging.info("wrote %s and its sentence splits: %d paragraphs, %d-d (config.dataset."
               "text_features=%r, text_dim=%d)", out, len(features), dim, name, dim)
  return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      prog="python -m avtext.tools.precompute_text_features",
      description="COOT text features of a dataset's meta file (avtext/data/coot_layout.py).")
  parser.add_argument("--dataset_dir", required=True,
                      help="COOT dataset directory (holds meta_<metadata_name>.json)")
  parser.add_argument("--metadata_name", default="all", help="reads meta_<metadata_name>.json")
  parser.add_argument("--bert_dir", default=None,
                      help="local HF BERT directory (default: the offline MiniLM-L6)")
  parser.add_argument("--layers", default="-2,-1", type=parse_layers,
                      help="hidden states to concatenate (HF numbering, -1 = last layer)")
  parser.add_argument("--name", default=None, help="output name (default: the official naming)")
  parser.add_argument("--batch_size", default=16, type=int, help="paragraphs per forward pass")
  parser.add_argument("--force", action="store_true", help="overwrite existing features")
  return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> pathlib.Path:
  args = parse_args(argv)
  logging.set_verbosity(logging.INFO)
  return precompute(args.dataset_dir, metadata_name=args.metadata_name, bert_dir=args.bert_dir,
                    layers=args.layers, name=args.name, batch_size=args.batch_size,
                    force=args.force)


if __name__ == "__main__":
  main()
