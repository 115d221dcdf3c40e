"""Real datasets avtext has no builder for yet: opening one says what to prepare."""
import ml_collections

from avtext.data import builders

_PREPARE = {
    "videocc3m": (
        "VideoCC3M (VideoCC §3.2): download the clips listed in the public VideoCC "
        "release (video id, start/end seconds, caption) as local video files, extract "
        "RGB at 25 fps and 16 kHz mono audio, and write them as a TFDS array_record "
        "dataset with fields frames/audio/has_audio/caption/clip_id; then set "
        "--config.dataset.name=tfds:<your_builder> --config.dataset.data_dir=<dir>"),
    "msrvtt": (
        "MSR-VTT: download the videos and the 1k-A test split captions, decode at 25 fps "
        "with 16 kHz mono audio (zeros + has_audio=False where a clip has none, VideoCC "
        "app. C) and write a TFDS array_record dataset with fields "
        "frames/audio/has_audio/caption/clip_id; then set "
        "--config.evals.msrvtt.dataset.name=tfds:<your_builder> "
        "--config.evals.msrvtt.dataset.data_dir=<dir>"),
}


def _without_builder(dataset: ml_collections.ConfigDict, split: str):
  del split  # every split needs the same preparation
  name = dataset.name
  raise FileNotFoundError(
      f"config.dataset: {name!r} has no builder in avtext yet, so the paper setup cannot "
      f"run here. To prepare it: {_PREPARE[name]}. To run this experiment end to end on the "
      "embedded synthetic world instead, use the ':demo' variant: `make demo`, or "
      "`python -m avtext.main --config=configs/videocc_avr.py:demo --workdir=workdirs/demo` "
      "(see configs/synthetic_video_pretrain.py for its pretrained RGB tower).")


for _name in _PREPARE:
  builders.register_dataset(_name)(_without_builder)
