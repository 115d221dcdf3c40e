r"""Store a registered clips dataset as TFDS array_record files (decode once, read many times).

    python -m avtext.data.materialize --config=configs/videocc_avr.py \
        --config.evals.msrvtt.dataset.path=/data/msrvtt --dataset_of=evals.msrvtt \
        --splits=train,test --name=msrvtt_clips --data_dir=/data/tfds [--short_side=256]

reads each split of the dataset `config.dataset` names (or `config.<dataset_of>.dataset`,
with the evaluator's overrides) through the registry -- for the real datasets the
user's media files, lazily, via `builders.files` -- and writes every clip (frames at the
dataset's fps, resized on decode to --short_side; 16 kHz audio; has_audio, caption,
clip_id, video_id) as one record of the TFDS dataset `<name>` under --data_dir, with a
progress bar per split. Records are in the source's order. Entries that fail to decode
while being written are counted by reason like those the source skipped when it opened:
both go to <data_dir>/<name>/skipped.json and are printed. Afterwards train or evaluate
on it with

    --config.dataset.name=tfds:<name> --config.dataset.data_dir=<data_dir>

(`builders.tfds_clips`). An audio-only dataset (Clotho) stores no frames.
"""
from __future__ import annotations

import collections
import json
import pathlib
import sys
from typing import Any, Iterator

from absl import app
from absl import flags
import ml_collections
from ml_collections import config_flags
import numpy as np

from avtext.data import builders
from avtext.data import video_io

_CONFIG = config_flags.DEFINE_config_file('config', None, 'An experiment config.')
_DATASET_OF = flags.DEFINE_string(
    'dataset_of', None, 'Read config.<this>.dataset (e.g. evals.msrvtt, merged over '
    'config.dataset as the evaluator merges it) instead of config.dataset.')
_SPLITS = flags.DEFINE_list('splits', ['train'], 'Splits to store.')
_NAME = flags.DEFINE_string('name', None, 'TFDS dataset name to write (snake_case).')
_DATA_DIR = flags.DEFINE_string('data_dir', None, 'TFDS data dir to write under.')
_SHORT_SIDE = flags.DEFINE_integer('short_side', None,
                                   'Resize frames on decode to this shorter side.')


def dataset_config(config: ml_collections.ConfigDict, of: str | None) -> ml_collections.ConfigDict:
  """config.dataset, or config.<of>.dataset's overrides over it (as evaluators merge)."""
  merged = ml_collections.ConfigDict(config.dataset.to_dict())
  if of:
    node = config
    for part in of.split('.'):
      if part not in node:
        raise ValueError(f'--dataset_of={of}: the config has no {part!r}')
      node = node[part]
    overrides = node.get('dataset') or {}
    overrides = overrides.to_dict() if hasattr(overrides, 'to_dict') else dict(overrides)
    merged.update({k: v for k, v in overrides.items() if v is not None})
  return merged


def _features(with_frames: bool):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  f = {'audio': tfds.features.Tensor(shape=(None,), dtype=np.float32),
       'has_audio': tfds.features.Tensor(shape=(), dtype=np.bool_),
       'caption': tfds.features.Text(), 'clip_id': tfds.features.Text(),
       'video_id': tfds.features.Text()}
  if with_frames:
    f['frames'] = tfds.features.Tensor(shape=(None, None, None, 3), dtype=np.uint8,
                                       encoding=tfds.features.Encoding.ZLIB)
  return tfds.features.FeaturesDict(f)


def _records(source: Any, split: str, with_frames: bool,
             failed: collections.Counter) -> Iterator[tuple[int, dict]]:
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  for i in tqdm(range(len(source)), desc=f'materializing {split}', file=sys.stdout):
    try:
      ex = source[i]
    except video_io.VideoReadError as e:
      failed[e.reason] += 1
      print(f'skipped {e}', flush=True)
      continue
    record = {'audio': np.asarray(ex['audio'], np.float32), 'has_audio': bool(ex['has_audio']),
              'caption': str(ex['caption']), 'clip_id': str(ex['clip_id']),
              'video_id': str(ex.get('video_id') or ex['clip_id'])}
    if with_frames:
      record['frames'] = np.asarray(ex['frames'], np.uint8)
    yield i, record


def materialize(dataset: ml_collections.ConfigDict, splits: list[str], *, name: str,
                data_dir: str | pathlib.Path) -> dict[str, dict]:
  """Writes the splits; returns {split: {'records': n, 'skipped': {reason: n}}}."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  sources = {s: builders.get_source(dataset, s) for s in splits}
  for s, src in sources.items():
    if src.kind != builders.CLIPS:
      raise ValueError(f'dataset {dataset.name!r} split {s!r} is a {src.kind!r} source; '
                       'materialize stores clips')
  with_frames = all(getattr(src, 'need', 'video') == 'video' for src in sources.values())
  failed = {s: collections.Counter() for s in splits}
  tfds.dataset_builders.store_as_tfds_dataset(
      name=name, version='1.0.0', features=_features(with_frames),
      split_datasets={s: _records(src, s, with_frames, failed[s])
                      for s, src in sources.items()},
      data_dir=str(data_dir), file_format='array_record', disable_shuffling=True,
      description=f'avtext.data.materialize of {dataset.name!r}')
  summary = {}
  for s, src in sources.items():
    counts = collections.Counter(getattr(src, 'skip_counts', dict)())
    counts.update(failed[s])
    summary[s] = {'records': len(src) - sum(failed[s].values()),
                  'skipped': dict(sorted(counts.items()))}
  out = pathlib.Path(data_dir) / name / 'skipped.json'
  out.write_text(json.dumps({'dataset': dataset.to_dict(), 'splits': summary}, indent=1,
                            default=str))
  return summary


def main(argv):
  del argv
  if _CONFIG.value is None or not _NAME.value or not _DATA_DIR.value:
    raise app.UsageError('--config, --name and --data_dir are required')
  dataset = dataset_config(_CONFIG.value, _DATASET_OF.value)
  if _SHORT_SIDE.value:
    dataset.short_side = _SHORT_SIDE.value
  summary = materialize(dataset, _SPLITS.value, name=_NAME.value, data_dir=_DATA_DIR.value)
  for split, s in summary.items():
    skipped = ', '.join(f'{k} {v}' for k, v in s['skipped'].items()) or 'none'
    print(f'{split}: {s["records"]} records; skipped: {skipped}')
  print(f'read it with --config.dataset.name=tfds:{_NAME.value} '
        f'--config.dataset.data_dir={_DATA_DIR.value}')


if __name__ == '__main__':
  app.run(main)
