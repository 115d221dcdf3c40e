"""Dataset name -> random-access source of clip examples.

`config.dataset.name` picks the source:
  synthetic_clips        the procedural world (avtext.data.synthetic), no files needed
  tfds:<name>[/config]   a materialized TFDS dataset in array_record format under
                         config.dataset.data_dir, read with random access; the path
                         real datasets take (and that tests exercise with the
                         synthetic world's TFDS builder)
  videocc3m, msrvtt      real datasets: their builders are not written yet, so these
                         fail with what to prepare.

Every source is a grain RandomAccessDataSource (`__len__`, `__getitem__`) whose
examples hold 'frames' uint8 [T, H, W, 3], 'audio' float32 [S], 'has_audio',
'caption' and 'clip_id'. Sources may add `render_frames(i, idx)` and
`render_audio(i, start, n)` for cheap partial access.
"""
import ml_collections

_SPLIT_ALIASES = {"validation": "val"}

_REAL = {
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
        "--config.dataset.eval_name=tfds:<your_builder> --config.dataset.data_dir=<dir>"),
}


def clip_source(dataset: ml_collections.ConfigDict, split: str, *, name: str | None = None):
  """The source for `split` of dataset `name` (default: config.dataset.name)."""
  name = name or dataset.name
  split = _SPLIT_ALIASES.get(split, split)
  if name == "synthetic_clips":
    from avtext.data import synthetic  # pylint: disable=g-import-not-at-top
    world = dict(dataset.get("world", {}) or {})
    num = dataset.get("num_train") if split == "train" else dataset.get("num_eval")
    return synthetic.ClipCaptionSource(
        split, seed=dataset.get("world_seed", 0), num_examples=num,
        spec=synthetic.WorldSpec(**world))
  if name.startswith("tfds:"):
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    if not dataset.get("data_dir"):
      raise ValueError(f"config.dataset.name={name!r} needs config.dataset.data_dir")
    tfds_split = {"val": "validation"}.get(split, split)
    try:
      return tfds.data_source(name[len("tfds:"):], split=tfds_split,
                              data_dir=dataset.data_dir, download=False)
    except Exception as e:  # TFDS raises several types for a missing dataset
      raise FileNotFoundError(
          f"{dataset.data_dir}: cannot open {name!r} split {tfds_split!r} as array_record "
          f"({type(e).__name__}: {e}); materialize it first (see README, 'Datasets')") from e
  if name in _REAL:
    raise FileNotFoundError(
        f"config.dataset: {name!r} has no builder in avtext yet, so the paper setup cannot "
        f"run here. To prepare it: {_REAL[name]}. To run this experiment end to end on the "
        "embedded synthetic world instead, use the ':demo' variant: `make demo`, or "
        "`python -m avtext.main --config=configs/videocc_avr.py:demo --workdir=workdirs/demo` "
        "(see configs/synthetic_video_pretrain.py for its pretrained RGB tower).")
  raise ValueError(f"config.dataset.name={name!r}; expected synthetic_clips, tfds:<name>, "
                   f"or one of {sorted(_REAL)}")
