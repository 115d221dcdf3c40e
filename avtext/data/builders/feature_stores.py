"""`features:hdf5`, `features:npz`, `features:array_record`: precomputed per-item arrays.

Config fields (config.dataset):
  path          root directory of the dataset (required)
  features      schema, {key: 'dtype[dims]'} (required), e.g.
                {'video': 'float32[T, 512]', 'sentences': 'str[N]'}; see avtext.data.array_store
  files         optional {split: file or dir}, relative to path (or absolute); defaults:
                  hdf5          <path>/<split>.h5
                  npz           <path>/<split>/            (one <id>.npz per item)
                  array_record  <path>/<split>.array_record (or its -NNNNN-of-NNNNN shards)
  ids           optional {split: text file}, relative to path: the split's item ids,
                one per line, in order (hdf5 / npz only), e.g. split lists over one
                features file shared by all splits
  skip_missing  False (default): an item absent from the store or lacking a schema key
                raises; True: such items are dropped when the split opens, counted and
                logged in one line (hdf5 / npz only)
Split 'validation' is read as 'val'. The layouts are documented in
`array_store.Hdf5Features`, `array_store.NpzFeatures` and `array_store.ArrayRecordFeatures`.
"""
import os

import ml_collections

from avtext.data import builders
from avtext.data import array_store

_DEFAULT_FILES = {"hdf5": "{split}.h5", "npz": "{split}", "array_record": "{split}.array_record"}


def _read_ids(file: str) -> list[str]:
  if not os.path.isfile(file):
    raise FileNotFoundError(f"{file}: no such id list (config.dataset.ids); expected one "
                            "item id per line")
  with open(file, encoding="utf-8") as f:
    return [line.strip() for line in f if line.strip()]


def _open(layout: str, dataset: ml_collections.ConfigDict, split: str) -> array_store.FeatureSource:
  name = dataset.name
  for field in ("path", "features"):
    if not dataset.get(field):
      raise ValueError(f"config.dataset.name={name!r} needs config.dataset.{field} (see "
                       "avtext/data/builders/feature_stores.py)")
  root = os.fspath(dataset.path)
  files = dict(dataset.get("files") or {})
  path = os.path.join(root, files.get(split, _DEFAULT_FILES[layout].format(split=split)))
  schema = dict(dataset.features)
  ids_file = (dict(dataset.get("ids") or {})).get(split)
  skip_missing = bool(dataset.get("skip_missing", False))
  if layout == "array_record":
    if ids_file or skip_missing:
      raise ValueError(f"config.dataset.name={name!r}: array_record records are dense, so "
                       "dataset.ids and dataset.skip_missing do not apply; select and filter "
                       "items when writing the records")
    return array_store.ArrayRecordFeatures(path, schema)
  ids = _read_ids(os.path.join(root, ids_file)) if ids_file else None
  cls = array_store.Hdf5Features if layout == "hdf5" else array_store.NpzFeatures
  return cls(path, schema, ids=ids, skip_missing=skip_missing)


@builders.register_dataset("features:hdf5")
def hdf5(dataset: ml_collections.ConfigDict, split: str) -> array_store.FeatureSource:
  return _open("hdf5", dataset, split)


@builders.register_dataset("features:npz")
def npz(dataset: ml_collections.ConfigDict, split: str) -> array_store.FeatureSource:
  return _open("npz", dataset, split)


@builders.register_dataset("features:array_record")
def array_record(dataset: ml_collections.ConfigDict, split: str) -> array_store.FeatureSource:
  return _open("array_record", dataset, split)
