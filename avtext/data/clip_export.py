r"""Store a registered clips dataset (decode once, read many times): the library behind
`python -m avtext.materialize` (see there). FORMATS: 'frames_jpeg' (default), 'frames_png',
'frames_raw' -- a record per frame, `avtext.data.framestore`, read as `frames:<name>` -- or
'tfds', a TFDS dataset of one record per clip, read as `tfds:<name>`."""
from __future__ import annotations

import collections
import concurrent.futures
import pathlib
import sys
from typing import Any, Iterator

import ml_collections
import numpy as np

from avtext import atomic
from avtext import errors
from avtext.data import builders
from avtext.data import framestore
from avtext.data import video_io

FORMATS = framestore.FORMATS + ('tfds',)
DEFAULT_FORMAT = 'frames_jpeg'
READ_NAME = {'tfds': 'tfds:{name}', **{f: 'frames:{name}' for f in framestore.FORMATS}}


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


def _records(source: Any, split: str, with_frames: bool, failed: collections.Counter,
             workers: int) -> Iterator[tuple[int, dict]]:
  """(index, whole clip) in the source's order, `workers` clips decoded at a time."""
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  with concurrent.futures.ThreadPoolExecutor(max(1, workers)) as pool:
    ahead = collections.deque()
    todo = iter(range(len(source)))
    for i in tqdm(range(len(source)), desc=f'materializing {split}', file=sys.stdout):
      for j in todo:
        ahead.append(pool.submit(source.__getitem__, j))
        if len(ahead) > workers:
          break
      try:
        ex = ahead.popleft().result()
      except video_io.VideoReadError as e:
        failed[e.reason] += 1
        print(f'skipped {e}', flush=True)
        continue
      record = {'audio': np.asarray(ex['audio'], np.float32),
                'has_audio': bool(ex['has_audio']), 'caption': str(ex['caption']),
                'clip_id': str(ex['clip_id']),
                'video_id': str(ex.get('video_id') or ex['clip_id'])}
      if with_frames:
        record['frames'] = np.asarray(ex['frames'], np.uint8)
      yield i, record


def _frame_records(source: Any, records: Iterator[tuple[int, dict]]) -> Iterator[dict]:
  """`records` with 'num_frames' where there are no frames (an audio dataset's clips keep
  their length at the dataset's fps, so frame samplers still work on the store)."""
  for i, r in records:
    if 'frames' not in r:
      r['num_frames'] = source.describe(i)['num_frames'] if hasattr(source, 'describe') else 0
    yield r


def materialize(dataset: ml_collections.ConfigDict, splits: list[str], *, name: str,
                data_dir: str | pathlib.Path, fmt: str = DEFAULT_FORMAT, quality: int = 95,
                workers: int = 4) -> dict[str, dict]:
  """Writes the splits as `fmt` (FORMATS; `quality`: JPEG's), reading `workers` clips at a
  time; returns {split: {'records': n, 'skipped': {reason: n}}}."""
  if fmt not in FORMATS:
    raise errors.BadInput(f'--format={fmt}: not a format; choose one of {", ".join(FORMATS)}')
  if not 1 <= quality <= 100:
    raise errors.BadInput(f'--quality={quality}: JPEG quality must be in 1..100 (95: the default)')
  if workers < 1:
    raise errors.BadInput(f'--workers={workers}: must be >= 1')
  sources = {s: builders.get_source(dataset, s) for s in splits}
  for s, src in sources.items():
    if src.kind != builders.CLIPS:
      raise ValueError(f'dataset {dataset.name!r} split {s!r} is a {src.kind!r} source; '
                       'materialize stores clips')
  with_frames = all(getattr(src, 'need', 'video') == 'video' for src in sources.values())
  failed = {s: collections.Counter() for s in splits}
  records = {s: _records(src, s, with_frames, failed[s], workers) for s, src in sources.items()}
  if fmt == 'tfds':
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    tfds.dataset_builders.store_as_tfds_dataset(
        name=name, version='1.0.0', features=_features(with_frames), split_datasets=records,
        data_dir=str(data_dir), file_format='array_record', disable_shuffling=True,
        description=f'avtext.materialize of {dataset.name!r}')
  else:
    for s, src in sources.items():
      framestore.write(pathlib.Path(data_dir) / name, s, _frame_records(src, records[s]),
                       fmt=fmt, quality=quality, sample_rate=dataset.get('sample_rate', 16000),
                       source=f'{dataset.name} {s}', workers=workers)
  summary = {}
  for s, src in sources.items():
    counts = collections.Counter(getattr(src, 'skip_counts', dict)())
    counts.update(failed[s])
    summary[s] = {'records': len(src) - sum(failed[s].values()),
                  'skipped': dict(sorted(counts.items()))}
  out = pathlib.Path(data_dir) / name / 'skipped.json'
  atomic.write_json(out, {'dataset': dataset.to_dict(), 'format': fmt, 'splits': summary},
                    indent=1, default=str)
  return summary
