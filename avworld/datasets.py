"""The world's datasets, `synthetic_clips` and `synthetic_smit`: no files needed.

Registered with the one dataset registry (`avtext.data.builders`, which reads this
module through setup.py's entry point `avtext.datasets`); each declares the world's ground truth (`truth.WORLD`,
`avtext.data.ground_truth.declare`).

Config fields: dataset.world (WorldSpec fields), dataset.world_seed (default 0),
dataset.num_train (train split size) and dataset.num_eval (val/test size); None or absent
sizes take `clips.DEFAULT_SPLIT_SIZES` (`spoken_clips.SPLIT_SIZES` for synthetic_smit:
20k / 1k / 2k). synthetic_smit (the Spoken Moments stand-in, `spoken_clips`) adds
dataset.asr_wer (0.15) and dataset.asr_substitution_share (0.7) and dataset.num_val (the
val size, default num_eval), and its world defaults to 3 s clips; dataset.speech ('tones',
the default, or 'espeak': real speech, `tts`) and dataset.asr_transcripts (a directory of
`avworld.tools.smit_asr`: the real engine's transcripts, <dir>/<split>.json, replace the
seeded word errors).
"""
import json
import pathlib

import ml_collections

from avtext.data import builders
from avtext.data import ground_truth
from avworld import clips
from avworld import spoken_clips
from avworld import truth
from avworld import world


class SyntheticClips(clips.ClipCaptionSource):
  """`ClipCaptionSource` as a registry source (kind 'clips')."""
  kind = builders.CLIPS


@builders.register_dataset("synthetic_clips")
@ground_truth.declare(truth.WORLD)
def synthetic_clips(dataset: ml_collections.ConfigDict, split: str) -> SyntheticClips:
  num = dataset.get("num_train") if split == "train" else dataset.get("num_eval")
  return SyntheticClips(split, seed=dataset.get("world_seed", 0), num_examples=num,
                        spec=world.WorldSpec(**dict(dataset.get("world", {}) or {})))


class SyntheticSpokenClips(spoken_clips.SpokenClipSource):
  """`SpokenClipSource` as a registry source (kind 'clips', plus 'transcript' and
  'spoken_caption')."""
  kind = builders.CLIPS


@builders.register_dataset("synthetic_smit")
@ground_truth.declare(truth.WORLD)
def synthetic_smit(dataset: ml_collections.ConfigDict, split: str) -> SyntheticSpokenClips:
  num = dataset.get("num_train") if split == "train" else dataset.get("num_eval")
  if split == "val" and dataset.get("num_val"):
    num = dataset.num_val
  spec = {"duration_s": spoken_clips.CLIP_SECONDS, **dict(dataset.get("world", {}) or {})}
  transcripts = None
  if dataset.get("asr_transcripts"):
    path = pathlib.Path(dataset.asr_transcripts) / f"{split}.json"
    if not path.is_file():
      raise FileNotFoundError(f"dataset.asr_transcripts: no {path}; transcribe the split with "
                              f"python -m avworld.tools.smit_asr --splits={split}")
    transcripts = json.loads(path.read_text())["transcripts"]
  return SyntheticSpokenClips(split, seed=dataset.get("world_seed", 0), num_examples=num,
                              spec=world.WorldSpec(**spec), wer=dataset.get("asr_wer", 0.15),
                              substitution_share=dataset.get("asr_substitution_share", 0.7),
                              speech=dataset.get("speech", "tones"), transcripts=transcripts)
