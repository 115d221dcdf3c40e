"""Dataset registry: `config.dataset.name` -> random-access source of examples.

Built-in names (each registered by its module in this package; a module is loaded the
first time one of its names is looked up, so importing this package stays cheap and e.g.
TensorFlow is imported only by a config that reads TFDS files). Another installed package
adds its own datasets through the entry-point group `avtext.datasets` (setup.py's
`entry_points`; `avtext.config_registry`): the demos' procedural world, a package of its own,
adds its datasets that way, and `registered_names()` lists them too.

  smit_features            S-MiT phase-1 features (frozen backbones' embeddings, word
                           features, log-mels) in `builders.smit`'s layout
  smit                     the real S-MiT clips: DIR/<split>.csv of video, spoken caption
                           audio and ASR transcript (`builders.smit`)
  frames:<name>            a dataset `python -m avtext.materialize` stored frame by frame
                           (JPEG / PNG / raw records, `avtext.data.framestore`) under
                           config.dataset.data_dir: a read decodes only the sampled
                           frames; the fast path for real clip datasets
  tfds:<name>[/config]     a materialized TFDS dataset in array_record format under
                           config.dataset.data_dir, a record per clip, read with random
                           access (`materialize --format=tfds`)
  features:hdf5            precomputed per-item arrays (COOT / TVR style) under
  features:npz             config.dataset.path; layouts and config fields in
  features:array_record    `builders.feature_stores` and `avtext.data.array_store`
  coot                     COOT's feature layout (ActivityNet-captions, YouCook2, or files
                           written in that layout) under config.dataset.path, see
                           `builders.coot` and `avtext.data.coot_files`
  tvc                      TV show Captions (TVR app. D) in the official TVCaption layout
                           (annotation jsonl, TVQA subtitles, clip-feature h5) under
                           config.dataset.path, see `builders.tvc`; moments of a 'features' kind
  tvr                      TV show Retrieval queries and their split's video corpus in the
                           official TVRetrieval layout (annotation jsonl, video / subtitle /
                           query feature h5) under config.dataset.path, see `builders.tvr`
  videocc_mined            the clips `python -m avtext.mine` found (its CSV + the corpus
                           videos) under config.dataset.path, see `builders.mined`
  videocc3m                the VideoCC release CSV + your downloaded videos / clips
  msrvtt                   MSR-VTT videos + annotations: train (9k), val, test (= test_1ka,
                           the 1k-A list), test_full
  audiocaps                AudioCaps captions + AudioSet segments (audio, video where present)
  clotho                   Clotho v2 captions + audio (audio only)
                           (these four read the user's media files lazily through
                           `builders.media_clips.MediaClips`: layouts in their modules; bad files
                           are counted by reason; `python -m avtext.materialize`
                           stores them as `frames:` or `tfds:` array_record)

A factory `(dataset_config, split) -> source` is registered with
`@register_dataset(name)` (or `prefix=True` for a family such as 'tfds:');
`dataset_config.name` is the name being opened. Every source is a grain
RandomAccessDataSource (`__len__`, `__getitem__`) with a `kind`:

  'clips'     examples hold 'frames' uint8 [T, H, W, 3], 'audio' float32 [S],
              'has_audio', 'caption' and 'clip_id' (and 'video_id' where a video has
              several captions); a source may add
              `describe(i)`, `render_frames(i, idx)` and `render_audio(i, start, n)`
              for cheap partial access (see `pipelines.ClipReader`).
  'features'  `avtext.data.array_store.FeatureSource`: a dict of numpy arrays (leading
              axes of variable length) plus host fields ('id', strings); batch them
              with `array_store.collate`.

A source whose split can come without the references its evaluators score (TVR's and
TVC's released test_public) says so in `missing_references`: None, or what is missing,
naming the file and field (`avtext.evals.check_splits` refuses to select on it).
"""
from typing import Any, Callable

import ml_collections

from avtext import config_registry

CLIPS = "clips"
FEATURES = "features"
KINDS = (CLIPS, FEATURES)

_SPLIT_ALIASES = {"validation": "val"}

# Every `@register_dataset("<name>")` in avtext/data/builders/ and in the packages of the
# entry-point group `avtext.datasets`; a module is imported when one of its names is
# looked up.
DATASETS = config_registry.Registry(
    "dataset", "avtext.data.builders", "register_dataset",
    message="{where}={name!r} is not a registered dataset; registered: {joined}")

Factory = Callable[[ml_collections.ConfigDict, str], Any]
# Decorator: `factory(dataset_config, split) -> source` opens dataset `name`; with
# `prefix=True`, every name starting with `name` (e.g. 'tfds:') that no exact
# registration claims goes to `factory`.
register_dataset = DATASETS.register
registered_names = DATASETS.names


def width_mismatch(key: str, value, where, width: int, *, model_reads_it: bool) -> str:
  """The message of stored features whose width is not config.dataset.<key>: it starts
  with the field (`main` reports it as the flag) and says what to set; with
  `model_reads_it`, config.model.<key> as well (the model's own copy of the width)."""
  model = f" --config.model.{key}={width}" if model_reads_it else ""
  return (f"config.dataset.{key}={value}: the features in {where} are {width}-d; set "
          f"--config.dataset.{key}={width}{model}, or point --config.dataset.path at "
          f"features of width {value}")


def get_source(dataset_config: ml_collections.ConfigDict, split: str):
  """The source of `split` ('validation' = 'val') of dataset `dataset_config.name`."""
  name = dataset_config.name
  split = _SPLIT_ALIASES.get(split, split)
  factory = DATASETS.get(name, where="config.dataset.name")
  source = factory(dataset_config, split)
  kind = getattr(source, "kind", None)
  if kind not in KINDS:
    raise TypeError(f"dataset {name!r}: {factory.__module__}.{factory.__qualname__} returned "
                    f"{type(source).__name__} with kind={kind!r}; a source's kind must be "
                    f"one of {KINDS}")
  return source

