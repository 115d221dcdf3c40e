r"""`clotho`: Clotho v2 audio + captions, audio only (VideoCC §5.4, Table 6).

    --config.dataset.name=clotho --config.dataset.path=DIR

DIR/clotho_captions_development.csv   Clotho's release: header file_name,caption_1..
DIR/clotho_captions_validation.csv    caption_5
DIR/clotho_captions_evaluation.csv
DIR/development/<file_name>           the audio files (.wav) of each split
DIR/validation/<file_name>
DIR/evaluation/<file_name>
Splits: train = development, val = validation, test = evaluation. Each of a file's five
captions is an entry (the paper, after [59], treats each test caption as a query); they
share the file name as video_id. Audio only: use a model with
config.model.video.modalities="audio". num_frames counts the clip at `dataset.fps` only
to place the audio windows. Files without audio or bad are counted by reason
(`builders.media_clips`; shared fields in `media_clips.options`).
"""
from __future__ import annotations

import pathlib

import ml_collections

from avtext.data import builders
from avtext.data.builders import media_clips

FOLDERS = {'train': 'development', 'val': 'validation', 'test': 'evaluation'}
CAPTIONS = tuple(f'caption_{k}' for k in range(1, 6))
PREPARE = ('Download Clotho v2 (clotho_captions_{development,validation,evaluation}.csv and '
           'the audio folders development/, validation/, evaluation/) into DIR and set '
           '--config.dataset.path=DIR; layout in avtext/data/builders/clotho.py. No download '
           'at hand: the demo world writes this layout (docs/videocc.md, "No download at '
           'hand?")')


def entries(root: pathlib.Path, split: str) -> list[media_clips.Entry]:
  if split not in FOLDERS:
    raise ValueError(f'clotho: no split {split!r}; splits: {", ".join(FOLDERS)}')
  folder = FOLDERS[split]
  path = media_clips.require_file(root / f'clotho_captions_{folder}.csv',
                                  f'the Clotho {folder} captions', PREPARE)
  out = []
  for row in media_clips.read_csv_rows(path, ('file_name',) + CAPTIONS):
    name = row['file_name']
    for k, column in enumerate(CAPTIONS):
      out.append(media_clips.Entry(str(root / folder / name), row[column], f'{name}#{k}', name))
  return out


@builders.register_dataset('clotho')
def clotho(dataset: ml_collections.ConfigDict, split: str) -> media_clips.MediaClips:
  root = media_clips.require_path(dataset, 'Clotho', PREPARE)
  es = entries(root, split)
  keep = dataset.get('num_train') if split == 'train' else dataset.get('num_test')
  return media_clips.MediaClips(es[:keep] if keep else es, **media_clips.options(
      dataset, split, f"clotho {split!r} under {root}", need='audio'))
