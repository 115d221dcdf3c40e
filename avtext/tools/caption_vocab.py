r"""Writes the vocabulary of a captioning config's training captions.

    python -m avtext.tools.caption_vocab --config=configs/videocc_caption.py:demo \
        --out=workdirs/demo/caption_vocab.json [--num=20000]
    python -m avtext.tools.caption_vocab --config=configs/mmt_tvc.py:demo \
        --out=workdirs/demo/tvc_word2idx.json [--min_count=5]

MMT (`config.model.name="mmt"`): TVCaption's word2idx (`vocab.WordVocab`):
the words of every training description seen more than --min_count times (the
official build_vocab.py rule, min_word_count 5) after the 7 special tokens.
Point `config.model.vocab` at it.

VideoCC's captioner: the GPT-2 BPE subset.

The captioner's embedding and softmax then have one row per BPE token the
corpus uses (plus <|endoftext|>) instead of GPT-2's 50257 (see
`tokenizers.CaptionTokenizer`): a 100x cheaper output layer for a
synthetic world with a few hundred words. Point
`config.model.decoder.vocab_subset` at the file. Captions are read from
`config.dataset`'s train split (the first --num, default all); a caption
with a token outside the subset is an error at training time, never a
silent drop.
"""
from absl import flags
from ml_collections import config_flags
import tqdm

from avtext import cli
from avtext import errors
from avtext.data import builders
from avtext.data import pipelines
from avtext.text import tokenizers
from avtext.text import vocab as vocab_lib

FLAGS = flags.FlagValues()
_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "the captioning experiment config (configs/videocc_caption.py or "
    "configs/mmt_tvc.py[:variant]; --config.<field>=<value> overrides)", flag_values=FLAGS)
_OUT = cli.DEFINE_path("out", None, "the JSON file to write", flag_values=FLAGS)
_NUM = flags.DEFINE_integer("num", None, "read the first NUM training captions (default: "
                            "all)", flag_values=FLAGS)
_MIN_COUNT = flags.DEFINE_integer("min_count", 5, "MMT: keep the words seen more than this",
                                  flag_values=FLAGS)
flags.mark_flags_as_required(["config", "out"], flag_values=FLAGS)


def word_vocab(config, out: str, num: int | None, min_count: int) -> None:
  source = builders.get_source(config.dataset, "train")
  n = len(source) if num is None else min(num, len(source))
  missing = getattr(source, "missing_references", None)  # known before any is read
  texts = [] if missing else [d for i in tqdm.tqdm(range(n), desc="moments")
                              for d in source.describe(i)["descs"]]
  if not texts:
    raise errors.BadInput(f"config.dataset.path={config.dataset.path!r}: no descriptions in "
                          f"the train split ({missing or 'every one is empty'}); the "
                          "vocabulary is built from the training descriptions: point it at "
                          "TVC's files with them")
  vocab = vocab_lib.WordVocab.build(texts, min_count=min_count)
  vocab.save(out)
  print(f"{out}: {len(vocab)} words (7 special) from {len(texts)} descriptions of {n} "
        "training moments")


def main(argv):
  if len(argv) > 1:
    raise errors.BadInput(f"unexpected arguments {list(argv[1:])}; see --help")
  config = cli.config_value(_CONFIG)
  if config.model.get("name") == "mmt":
    word_vocab(config, _OUT.value, _NUM.value, _MIN_COUNT.value)
    return
  source = builders.get_source(config.dataset, "train")
  n = len(source) if _NUM.value is None else min(_NUM.value, len(source))
  texts = (pipelines.source_caption(source, i) for i in tqdm.tqdm(range(n), desc="captions"))
  size = tokenizers.write_vocab_subset(texts, _OUT.value, config.data.get("bpe_dir"))
  print(f"{_OUT.value}: {size} GPT-2 tokens used by {n} training captions")


if __name__ == "__main__":
  cli.run(main, FLAGS)
