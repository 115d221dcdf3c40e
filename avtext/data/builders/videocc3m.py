r"""`videocc3m`: the VideoCC release CSV + the videos you downloaded (VideoCC §3.2).

    --config.dataset.name=videocc3m --config.dataset.path=DIR

DIR/video_cc_public.csv   the release (`dataset.csv` names another file): one row per
                          (clip, caption), four columns, an optional header row:
                            video id (a YouTube id, or a URL ending in v=<id>),
                            start µs, end µs, caption
DIR/videos/               your downloads (`dataset.videos_dir` names another directory),
                          either a whole video per id or one file per clip:
                            <id>.<ext>                    the video; the clip is cut at
                                                          [start, end) when read
                            <id>_<start µs>_<end µs>.<ext> the clip alone (as clip
                                                          downloaders write it)
                          ext: mp4, mkv, webm, avi, mov or m4v
Rows whose file is missing (the release lists ~10M clips; many videos are gone) or bad are
counted and logged by reason (`builders.media_clips`); the rest train. Only a 'train' split
(mined pairs are training data; evaluate on msrvtt / audiocaps / clotho).

Frames at `dataset.fps` (25, VideoCC app. C) over [start, end), 16 kHz mono audio, zeros
and has_audio False for a video without sound. Shared fields: `builders.media_clips.options`
(short_side, min_seconds, on_bad, verify, probe_cache). `dataset.num_train` keeps the
first N rows. `python -m avtext.materialize` stores the clips as array_record.
"""
from __future__ import annotations

import csv
import pathlib

import ml_collections

from avtext.data import builders
from avtext.data.builders import media_clips

PREPARE = ('Download the VideoCC release CSV (video_cc_public.csv, from '
           'github.com/google-research-datasets/videoCC-data) into DIR, the videos it lists '
           'into DIR/videos/<youtube id>.mp4 (or the clips as <id>_<start µs>_<end µs>.mp4), '
           'and set --config.dataset.path=DIR; see avtext/data/builders/videocc3m.py. To '
           'run end to end on the demo world instead: `make demo`, or python -m '
           'avtext.main --config=configs/videocc_avr.py:demo --workdir=workdirs/demo')


def video_id(value: str) -> str:
  """A YouTube id from the CSV's first column (an id, or a URL with v=<id>)."""
  value = value.strip()
  if 'v=' in value:
    return value.split('v=', 1)[1].split('&', 1)[0]
  return value.rstrip('/').rsplit('/', 1)[-1]


def read_csv(path: str | pathlib.Path) -> list[tuple[str, int, int, str]]:
  """(video id, start µs, end µs, caption) per row of a VideoCC-layout CSV; a first row
  whose times are not integers is a header. Errors name the file and line."""
  rows = []
  with open(path, newline='', encoding='utf-8') as f:
    for n, row in enumerate(csv.reader(f), 1):
      if not row:
        continue
      if len(row) != 4:
        raise ValueError(f'{path}:{n}: expected 4 columns (video id, start µs, end µs, '
                         f'caption), got {len(row)}')
      vid, start, end, caption = row
      try:
        start_us, end_us = int(start), int(end)
      except ValueError:
        if n == 1:
          continue  # a header
        raise ValueError(f'{path}:{n}: start and end must be integer microseconds, got '
                         f'{start!r}, {end!r}') from None
      if end_us <= start_us:
        raise ValueError(f'{path}:{n}: end {end_us} µs is not after start {start_us} µs')
      rows.append((vid, start_us, end_us, caption))
  return rows


def entries(root: pathlib.Path, csv_name: str, videos_dir: pathlib.Path,
            num: int | None = None) -> list[media_clips.Entry]:
  rows = read_csv(media_clips.require_file(root / csv_name, 'the VideoCC release CSV', PREPARE))
  out = []
  for vid, start, end, caption in rows[:num]:
    yid = video_id(vid)
    clip_file = media_clips.find_media(videos_dir, f'{yid}_{start}_{end}')
    clip_id = f'{yid}@{start}-{end}'
    if clip_file.exists():
      out.append(media_clips.Entry(str(clip_file), caption, clip_id, yid, 0.0,
                                   (end - start) / 1e6))
    else:
      out.append(media_clips.Entry(str(media_clips.find_media(videos_dir, yid)), caption,
                                   clip_id, yid, start / 1e6, end / 1e6))
  return out


@builders.register_dataset('videocc3m')
def videocc3m(dataset: ml_collections.ConfigDict, split: str) -> media_clips.MediaClips:
  if split != 'train':
    raise ValueError(f'videocc3m has only a train split, asked for {split!r}; evaluate on '
                     'msrvtt, audiocaps or clotho through config.evals.<name>.dataset')
  root = media_clips.require_path(dataset, 'VideoCC3M', PREPARE)
  videos = pathlib.Path(dataset.get('videos_dir') or root / 'videos')
  es = entries(root, dataset.get('csv') or 'video_cc_public.csv', videos,
               dataset.get('num_train'))
  return media_clips.MediaClips(
      es, **media_clips.options(dataset, split, f"videocc3m 'train' under {root}"))
