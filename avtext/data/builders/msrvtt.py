r"""`msrvtt`: MSR-VTT videos + annotations (VideoCC §5.1: train on 9k, test on 1k-A).

    --config.dataset.name=msrvtt --config.dataset.path=DIR

The layout most retrieval code uses (CLIP4Clip, X-CLIP, ...):
  DIR/MSRVTT_data.json          {"videos": [{"video_id": "video0", "split": "train" |
                                "validate" | "test", ...}], "sentences": [{"video_id",
                                "caption", "sen_id"}]}: the 10k videos, 20 captions each
  DIR/MSRVTT_JSFUSION_test.csv  the 1k-A test list (JSFusion): header key,vid_key,
                                video_id,sentence; one caption per video, 1000 rows
  DIR/MSRVTT_train.9k.csv       optional: header video_id; the 9k training videos (without
                                it: every video of the JSON not in the 1k-A list)
  DIR/videos/all/<video_id>.mp4 the videos (`dataset.videos_dir` names another directory;
                                mkv/webm/avi/mov also found)
Splits:
  train      the 9k videos, one entry per (video, caption): ~180k
  val        the JSON's 'validate' videos, every caption (note: inside the 9k, as usual)
  test       = test_1ka, the 1k-A list: 1000 (video, caption) pairs (Table 3's protocol)
  test_full  the JSON's 'test' videos (2990), every caption; captions of a video share
             its video_id, so the retrieval evaluator scores a caption against its video
Whole videos are clips (frames at `dataset.fps`, 25; audio 16 kHz; MSR-VTT videos
without sound get zeros and has_audio False, VideoCC app. C). Bad or missing files are
counted and logged by reason (`builders.media_clips`; fields in `media_clips.options`).
`dataset.num_train` / `dataset.num_test` keep the first N entries.
"""
from __future__ import annotations

import json
import pathlib

import ml_collections

from avtext.data import builders
from avtext.data.builders import media_clips

SPLITS = ('train', 'val', 'test', 'test_1ka', 'test_full')
PREPARE = ('Download MSR-VTT (the videos and MSRVTT_data.json, MSRVTT_JSFUSION_test.csv, '
           'MSRVTT_train.9k.csv as CLIP4Clip distributes them) into DIR with the videos under '
           'DIR/videos/all/, and set --config.dataset.path=DIR (docs/videocc.md: "Evaluate '
           'a run on MSR-VTT"); layout in avtext/data/builders/msrvtt.py. No download at '
           'hand: the demo world writes this layout (docs/videocc.md, "No download at '
           'hand?"); end to end on it: configs/videocc_avr.py:demo')


def _annotations(root: pathlib.Path) -> tuple[dict[str, str], dict[str, list[str]]]:
  """(video id -> split, video id -> captions in file order) from MSRVTT_data.json."""
  path = media_clips.require_file(root / 'MSRVTT_data.json', 'the MSR-VTT annotations', PREPARE)
  try:
    data = json.loads(path.read_text())
  except ValueError as e:
    raise ValueError(f'{path}: not JSON ({e})') from e
  for key in ('videos', 'sentences'):
    if key not in data:
      raise ValueError(f'{path}: no {key!r} list; expected MSR-VTT\'s videodatainfo layout')
  split = {}
  for n, v in enumerate(data['videos']):
    if 'video_id' not in v or 'split' not in v:
      raise ValueError(f'{path}: videos[{n}] has no "video_id" / "split": {v}')
    split[v['video_id']] = v['split']
  captions: dict[str, list[str]] = {}
  for n, s in enumerate(data['sentences']):
    if 'video_id' not in s or 'caption' not in s:
      raise ValueError(f'{path}: sentences[{n}] has no "video_id" / "caption": {s}')
    captions.setdefault(s['video_id'], []).append(s['caption'])
  return split, captions


def entries(root: pathlib.Path, split: str, videos_dir: pathlib.Path) -> list[media_clips.Entry]:
  if split not in SPLITS:
    raise ValueError(f'msrvtt: no split {split!r}; splits: {", ".join(SPLITS)}')
  video = lambda vid: str(media_clips.find_media(videos_dir, vid))
  if split in ('test', 'test_1ka'):
    test_list = media_clips.require_file(root / 'MSRVTT_JSFUSION_test.csv', 'the 1k-A test list',
                                         PREPARE)
    rows = media_clips.read_csv_rows(test_list, ('video_id', 'sentence'))
    return [media_clips.Entry(video(r['video_id']), r['sentence'], f"{r['video_id']}#0",
                              r['video_id']) for r in rows]
  split_of, captions = _annotations(root)
  if split == 'train':
    nine_k = root / 'MSRVTT_train.9k.csv'
    if nine_k.exists():
      vids = [r['video_id'] for r in media_clips.read_csv_rows(nine_k, ('video_id',))]
    else:
      test_list = media_clips.require_file(root / 'MSRVTT_JSFUSION_test.csv',
                                           'the 1k-A test list', PREPARE)
      test = {r['video_id'] for r in media_clips.read_csv_rows(test_list, ('video_id',))}
      vids = [v for v in split_of if v not in test]
  else:
    want = {'val': 'validate', 'test_full': 'test'}[split]
    vids = [v for v, s in split_of.items() if s == want]
  out = []
  for vid in vids:
    if vid not in captions:
      raise ValueError(f'{root / "MSRVTT_data.json"}: video {vid!r} has no sentence')
    out += [media_clips.Entry(video(vid), c, f'{vid}#{k}', vid)
            for k, c in enumerate(captions[vid])]
  return out


@builders.register_dataset('msrvtt')
def msrvtt(dataset: ml_collections.ConfigDict, split: str) -> media_clips.MediaClips:
  root = media_clips.require_path(dataset, 'MSR-VTT', PREPARE)
  videos = pathlib.Path(dataset.get('videos_dir') or root / 'videos' / 'all')
  es = entries(root, split, videos)
  keep = dataset.get('num_train') if split == 'train' else dataset.get('num_test')
  return media_clips.MediaClips(es[:keep] if keep else es, **media_clips.options(
      dataset, split, f"msrvtt {split!r} under {root}"))
