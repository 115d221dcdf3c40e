"""`frames:<name>`: clips materialized frame by frame (`python -m avtext.materialize
--format=frames_jpeg|frames_png|frames_raw`), read with `avtext.data.framestore.FrameClips`:
a training read decodes only the frames its sampler picks.

Config fields: dataset.data_dir (required), the directory holding <name>/<split>/.
"""
import pathlib

import ml_collections

from avtext.data import builders
from avtext.data import framestore


@builders.register_dataset("frames:", prefix=True)
def frame_clips(dataset: ml_collections.ConfigDict, split: str) -> framestore.FrameClips:
  name = dataset.name
  if not dataset.get("data_dir"):
    raise ValueError(f"config.dataset.name={name!r} needs config.dataset.data_dir (the "
                     "--data_dir python -m avtext.materialize wrote it under)")
  return framestore.FrameClips(pathlib.Path(dataset.data_dir) / name[len("frames:"):], split)
