"""`synthetic_clips`: the procedural world, no files needed.

Config fields: dataset.world (WorldSpec fields), dataset.world_seed (default
0), dataset.num_train (train split size) and dataset.num_eval (val/test size);
None or absent sizes take `synthetic.DEFAULT_SPLIT_SIZES`.
"""
import ml_collections

from avtext.data import builders
from avtext.data.synthetic import clips
from avtext.data.synthetic import world


class SyntheticClips(clips.ClipCaptionSource):
  """`ClipCaptionSource` as a registry source (kind 'clips')."""
  kind = builders.CLIPS


@builders.register_dataset("synthetic_clips")
def synthetic_clips(dataset: ml_collections.ConfigDict, split: str) -> SyntheticClips:
  num = dataset.get("num_train") if split == "train" else dataset.get("num_eval")
  return SyntheticClips(split, seed=dataset.get("world_seed", 0), num_examples=num,
                        spec=world.WorldSpec(**dict(dataset.get("world", {}) or {})))
