r"""`audiocaps`: AudioCaps captions + the AudioSet clips you downloaded (VideoCC §5.4).

    --config.dataset.name=audiocaps --config.dataset.path=DIR

DIR/{train,val,test}.csv   AudioCaps' release: header audiocap_id,youtube_id,start_time,
                           caption (start_time: seconds into the YouTube video)
DIR/media/                 your downloads (`dataset.media_dir` names another directory):
                             <youtube_id>_<start_time>.<ext>  the 10 s AudioSet segment
                                                              (as AudioSet downloaders cut it)
                             <youtube_id>.<ext>              the whole video; the segment
                                                              [start_time, +10 s) is cut
                           ext: mp4, mkv, webm (video + audio; frames where present) or
                           wav, flac, m4a (audio only)
Every row is an entry; the test split's 5 captions of a clip share its youtube_id as
video_id (one audio, several queries). The paper reads audio and, where present, RGB
(`dataset.need`: "audio" (default: audio-only models, and files without video are fine)
or "video" (frames too: audio-only files are then skipped as no_video)). Files without
an audio stream are skipped as no_audio in an audio dataset. Bad or missing files are
counted by reason (`builders.media_clips`; shared fields in `media_clips.options`).
"""
from __future__ import annotations

import pathlib

import ml_collections

from avtext.data import builders
from avtext.data.builders import media_clips

SPLITS = ('train', 'val', 'test')
SEGMENT_S = 10.0
PREPARE = ('Download AudioCaps\' train.csv / val.csv / test.csv into DIR and the AudioSet '
           'segments they list into DIR/media/<youtube_id>_<start_time>.wav (or .mp4 with '
           'video), and set --config.dataset.path=DIR; layout in '
           'avtext/data/builders/audiocaps.py. No download at hand: the demo world writes '
           'this layout (docs/videocc.md, "No download at hand?")')
COLUMNS = ('audiocap_id', 'youtube_id', 'start_time', 'caption')


def entries(root: pathlib.Path, split: str, media: pathlib.Path) -> list[media_clips.Entry]:
  if split not in SPLITS:
    raise ValueError(f'audiocaps: no split {split!r}; splits: {", ".join(SPLITS)}')
  path = media_clips.require_file(root / f'{split}.csv', f'the AudioCaps {split} captions', PREPARE)
  suffixes = media_clips.VIDEO_SUFFIXES + media_clips.AUDIO_SUFFIXES
  out = []
  for n, row in enumerate(media_clips.read_csv_rows(path, COLUMNS), 2):
    yid = row['youtube_id']
    try:
      start = float(row['start_time'])
    except ValueError:
      raise ValueError(f'{path}:{n}: start_time must be seconds, got '
                       f'{row["start_time"]!r}') from None
    segment = media_clips.find_media(media, f'{yid}_{int(start)}', suffixes)
    if segment.exists():
      entry = media_clips.Entry(str(segment), row['caption'], row['audiocap_id'], yid, 0.0,
                                SEGMENT_S)
    else:
      entry = media_clips.Entry(str(media_clips.find_media(media, yid, suffixes)), row['caption'],
                                row['audiocap_id'], yid, start, start + SEGMENT_S)
    out.append(entry)
  return out


@builders.register_dataset('audiocaps')
def audiocaps(dataset: ml_collections.ConfigDict, split: str) -> media_clips.MediaClips:
  root = media_clips.require_path(dataset, 'AudioCaps', PREPARE)
  media = pathlib.Path(dataset.get('media_dir') or root / 'media')
  es = entries(root, split, media)
  keep = dataset.get('num_train') if split == 'train' else dataset.get('num_test')
  return media_clips.MediaClips(es[:keep] if keep else es, **media_clips.options(
      dataset, split, f"audiocaps {split!r} under {root}", need=dataset.get('need', 'audio')))
