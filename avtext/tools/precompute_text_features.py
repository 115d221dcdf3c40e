r"""COOT text features for a dataset's meta file (official `precompute_text.py`'s output).

    python -m avtext.tools.precompute_text_features --dataset_dir=/data/coot/activitynet \
        --bert_dir=/models/bert-base-uncased [--metadata_name=all] [--layers=-2,-1] [--force]

Reads `<dataset_dir>/meta_<metadata_name>.json`, turns each video's segment
texts into the "bert_paper" paragraph ("[CLS]", lower case, each sentence
ending in "[SEP]"), runs our `Bert` with the weights in `--bert_dir` (a local
HF BERT-family directory: config.json, vocab.txt, safetensors; default the
offline MiniLM-L6) and writes the per-token concatenation of `--layers` to
`<name>.h5` and the per-sentence token counts to `<name>_sentence_splits.json`
(layout: avtext/data/coot_layout.py). The default name is the official one,
`text_feat_<dataset>_meta_<metadata>_transformers_<model>_<layers>`, so the
configs' `dataset.text_features` find it (bert-base-uncased: 1536-d).
"""
import json
import pathlib

from absl import app
from absl import flags
from absl import logging

from avtext.data import coot_layout

_DIR = flags.DEFINE_string("dataset_dir", None, "COOT dataset directory (holds meta_*.json)")
_META = flags.DEFINE_string("metadata_name", "all", "meta_<name>.json")
_BERT = flags.DEFINE_string("bert_dir", None, "HF BERT dir (default: offline MiniLM-L6)")
_LAYERS = flags.DEFINE_string("layers", "-2,-1", "hidden-state layers to concatenate")
_NAME = flags.DEFINE_string("name", None, "output name (default: the official naming)")
_BATCH = flags.DEFINE_integer("batch_size", 16, "paragraphs per batch")
_FORCE = flags.DEFINE_bool("force", False, "overwrite existing features")


def main(argv):
  del argv
  if not _DIR.value:
    raise app.UsageError("--dataset_dir is required")
  directory = pathlib.Path(_DIR.value)
  meta_file = coot_layout.meta_path(directory, _META.value)
  if not meta_file.is_file():
    raise FileNotFoundError(f"{meta_file} not found: the COOT meta file (segments + texts)")
  meta = json.loads(meta_file.read_text())
  layers = tuple(int(x) for x in _LAYERS.value.split(","))
  model = pathlib.Path(_BERT.value).name if _BERT.value else "minilm-l6"
  name = _NAME.value or (f"text_feat_{directory.name}_meta_{_META.value}_transformers_"
                         f"{model}_{_LAYERS.value}")
  if (directory / f"{name}.h5").exists() and not _FORCE.value:
    logging.info("%s.h5 exists; nothing to do (--force overwrites)", directory / name)
    return
  paragraphs = {key: [seg["text"] for seg in value["segments"]] for key, value in meta.items()}
  features, lengths = coot_layout.encode_paragraphs(
      paragraphs, bert_dir=_BERT.value, layers=layers, batch_size=_BATCH.value)
  path = coot_layout.write_text_features(directory, name, features, lengths)
  logging.info("wrote %s (%d paragraphs)", path, len(features))


if __name__ == "__main__":
  app.run(main)
