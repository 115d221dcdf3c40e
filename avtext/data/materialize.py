r"""Store a registered clips dataset as TFDS array_record files (decode once, read many
times): the library behind `python -m avtext.materialize` (see there)."""
from __future__ import annotations

import collections
import json
import pathlib
import sys
from typing import Any, Iterator

import ml_collections
import numpy as np

from avtext import errors
from avtext.data import builders
from avtext.data import video_io

def dataset_config(config: ml_collections.ConfigDict, of: str | None) -> ml_collections.ConfigDict:
  """config.dataset, or config.<of>.dataset's overrides over it (as evaluators merge)."""
  merged = ml_collections.ConfigDict(config.dataset.to_dict())
  if of:
    node = config
    for part in of.split('.'):
      if part not in node:
        raise errors.BadInput(f'--dataset_of={of}: the config has no {part!r}')
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
