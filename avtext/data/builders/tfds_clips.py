"""`tfds:<name>[/config]`: clips materialized by a TFDS builder as array_record.

Config fields: dataset.data_dir (required), the TFDS data dir holding
<name>/<config>/<version>/*.array_record*. Split 'val' is read as TFDS's
'validation'. Records must hold the clip fields listed in `builders`.
"""
from typing import Any, Sequence

import ml_collections
import tensorflow_datasets as tfds

from avtext.data import builders


class TfdsClips:
  """A `tfds.data_source` as a registry source (kind 'clips'); `records` is the TFDS source."""
  kind = builders.CLIPS

  def __init__(self, records: Any):
    self.records = records

  def __len__(self) -> int:
    return len(self.records)

  def __getitem__(self, index: int) -> dict:
    return self.records[index]

  def __getitems__(self, indices: Sequence[int]) -> list[dict]:
    return self.records.__getitems__(indices)

  def __repr__(self) -> str:
    return f"TfdsClips({self.records!r})"


@builders.register_dataset("tfds:", prefix=True)
def tfds_clips(dataset: ml_collections.ConfigDict, split: str) -> TfdsClips:
  name = dataset.name
  if not dataset.get("data_dir"):
    raise ValueError(f"config.dataset.name={name!r} needs config.dataset.data_dir")
  tfds_split = {"val": "validation"}.get(split, split)
  try:
    records = tfds.data_source(name[len("tfds:"):], split=tfds_split,
                               data_dir=dataset.data_dir, download=False)
  except Exception as e:  # TFDS raises several types for a missing dataset
    raise FileNotFoundError(
        f"{dataset.data_dir}: cannot open {name!r} split {tfds_split!r} as array_record "
        f"({type(e).__name__}: {e}); materialize it first (see docs/videocc.md, 'Datasets')") from e
  return TfdsClips(records)
