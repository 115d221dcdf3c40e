r"""The synthetic world written as the real datasets' files: MSR-VTT, VideoCC3M, AudioCaps,
Clotho, S-MiT.

    python -m avworld.tools.synthetic_layout --layout=msrvtt --out=DIR \
        [--num_train=64 --num_val=16 --num_test=32] [--faults=truncated,empty,...]

writes DIR in the layout the `msrvtt` / `videocc3m` / `audiocaps` / `clotho` / `smit` builder reads
(their module docstrings): the clips of the `synthetic_clips` world encoded as H.264 +
AAC mp4s (16-bit wav for the audio datasets) with PyAV, and the annotation files naming
them. So the builders, `avtext.materialize`, `avtext.index` and docs/videocc.md's MSR-VTT
walk-through run on this machine without a download, and the tests compare what the
builders decode with the frames the world rendered.

For `smit`, clip i is `spoken_clips.SpokenClipSource(split, seed, spec)` clip i (use
--duration_s=3, S-MiT's clip length): its video, its spoken caption as a 16 kHz wav under
spoken/ and its ASR transcript in <split>.csv. Otherwise clip i of a split is
`ClipCaptionSource(split, seed, spec)` clip i; its first caption is
the world's, the others (MSR-VTT's, Clotho's several captions per clip) are further
captions of the same scene. `faults` adds one extra train entry per fault: the files
`video_io.write_fault` writes (truncated, empty, not_video, audio_only, short (0.2 s),
no_audio) and 'missing' (an entry without a file), with the outcome each gets from the
builders (`builders.media_clips`): skipped and counted by reason, except no_audio, which is
kept with zeros and has_audio False in a video dataset.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import pathlib

import numpy as np
from tqdm import tqdm

from avtext import atomic
from avtext.data import video_io
from avworld import captions
from avworld import clips
from avworld import spoken_clips
from avworld import tone_speech
from avworld import world

LAYOUTS = ('msrvtt', 'videocc3m', 'audiocaps', 'clotho', 'smit')
FAULTS = video_io.FAULTS + ('missing',)
# What a builder does with each fault (the corrupt-input tests check these).
OUTCOMES = {'video': {'truncated': 'truncated', 'empty': 'empty', 'not_video': 'unreadable',
                      'audio_only': 'no_video', 'short': 'short', 'no_audio': 'kept',
                      'missing': 'missing'},
            'audio': {'truncated': 'truncated', 'empty': 'empty', 'not_video': 'unreadable',
                      'audio_only': 'kept', 'short': 'short', 'no_audio': 'no_audio',
                      'missing': 'missing'}}


def source(split: str, num: int, spec: world.WorldSpec, seed: int, layout: str = ''
           ) -> clips.ClipCaptionSource:
  if layout == 'smit':
    return spoken_clips.SpokenClipSource(split, seed=seed, num_examples=num, spec=spec)
  return clips.ClipCaptionSource(split, seed=seed, num_examples=num, spec=spec)


def clip_captions(src: clips.ClipCaptionSource, index: int, n: int) -> list[str]:
  """The world's caption of clip `index`, then n - 1 more captions of its scene."""
  out = [src.describe(index)['caption']]
  rng = np.random.default_rng([src.seed, index, 7919])
  attributes = src.scene(index).attributes()
  while len(out) < n:
    text, _ = captions.render_caption(rng, captions.sample_mention(rng, attributes))
    out.append(text)
  return out


def _media(src, i: int, spec: world.WorldSpec):
  frames = src.render_frames(i, np.arange(spec.num_frames))
  audio = src.render_audio(i, 0, spec.num_samples)
  return frames, audio


def _write(path: pathlib.Path, src, i: int, spec: world.WorldSpec, *, audio_only: bool,
           fault: str | None = None) -> None:
  if fault == 'missing' or path.exists():
    return
  frames, audio = _media(src, i, spec)

  def write(tmp: pathlib.Path) -> None:
    if audio_only and fault is None:
      video_io.write_audio(tmp, audio, sample_rate=spec.sample_rate)
    elif audio_only and fault == 'no_audio':  # an audio dataset's file without sound
      video_io.write_video(tmp, frames, spec.fps)
    elif audio_only and fault == 'short':
      video_io.write_audio(tmp, audio[:int(0.2 * spec.sample_rate)],
                           sample_rate=spec.sample_rate)
    elif audio_only and fault == 'truncated':  # a .wav cut short: its header says 2 s
      video_io.write_audio(tmp, audio, sample_rate=spec.sample_rate)
      tmp.write_bytes(tmp.read_bytes()[:int(tmp.stat().st_size * 0.6)])
    else:
      video_io.write_fault(tmp, fault, frames, spec.fps, audio=audio,
                           sample_rate=spec.sample_rate)

  atomic.replace_with(path, write, durable=False)  # regenerable: no flush per file


@dataclasses.dataclass
class Written:
  root: pathlib.Path
  # split -> [(clip index in the world's split or -1 for a fault, file stem, captions)]
  items: dict[str, list[tuple[int, str, list[str]]]]
  faults: dict[str, str]  # fault -> file stem (train split)


def write(layout: str, out: str | pathlib.Path, *, sizes: dict[str, int],
          spec: world.WorldSpec = world.WorldSpec(), seed: int = 0,
          faults: tuple[str, ...] = (), captions_per_clip: int | None = None,
          progress: bool = True) -> Written:
  """Writes the layout under `out` (module docstring); returns what went where."""
  if layout not in LAYOUTS:
    raise ValueError(f'layout must be one of {LAYOUTS}, got {layout!r}')
  bad = set(faults) - set(FAULTS)
  if bad:
    raise ValueError(f'unknown faults {sorted(bad)}; expected some of {FAULTS}')
  root = pathlib.Path(out)
  root.mkdir(parents=True, exist_ok=True)
  audio_only = layout in ('audiocaps', 'clotho')
  ncap = captions_per_clip or {'msrvtt': 2, 'clotho': 5}.get(layout, 1)
  items: dict[str, list] = {}
  jobs = []
  fault_stems = {}
  for split, num in sizes.items():
    src = source(split, num, spec, seed, layout)
    items[split] = []
    caps = ((lambda i: [src.describe(i)['transcript']]) if layout == 'smit' else
            (lambda i: clip_captions(src, i, ncap)))  # noqa: E731
    for i in range(num):
      stem = f'{split}{i:05d}'
      items[split].append((i, stem, caps(i)))
      jobs.append((src, i, stem, None))
    if split == 'train':
      for k, fault in enumerate(faults):  # a fault is a copy of train clip k with a flaw
        stem = f'fault_{fault}'
        fault_stems[fault] = stem
        items[split].append((-1, stem, caps(k % num)))
        jobs.append((src, k % num, stem, fault))
  suffix = '.wav' if audio_only else '.mp4'
  media = {'msrvtt': root / 'videos' / 'all', 'videocc3m': root / 'videos',
           'audiocaps': root / 'media', 'smit': root / 'videos'}.get(layout)
  for src, i, stem, fault in tqdm(jobs, desc=f'writing synthetic {layout}', disable=not progress):
    if layout == 'clotho':
      split = src.split
      folder = {'train': 'development', 'val': 'validation', 'test': 'evaluation'}[split]
      path = root / folder / f'{stem}.wav'
    elif layout == 'audiocaps':  # stored as the cut segments: <youtube_id>_<start>.wav
      path = media / f'{stem}_0{suffix}'
    else:
      path = media / f'{stem}{suffix}'
    _write(path, src, i, spec, audio_only=audio_only, fault=fault)
    speech = root / 'spoken' / f'{stem}.wav'
    if layout == 'smit' and not speech.exists():
      atomic.replace_with(speech, lambda tmp: video_io.write_audio(
          tmp, src.render_speech(i), sample_rate=tone_speech.SAMPLE_RATE), durable=False)
  _annotations(layout, root, items, spec)
  atomic.write_text(root / 'synthetic.json', json.dumps({
      'format': 'avtext.synthetic_layout/1', 'layout': layout, 'seed': seed,
      'spec': dataclasses.asdict(spec), 'sizes': sizes, 'faults': list(faults)},
      indent=1), durable=False)
  return Written(root, items, fault_stems)


def _annotations(layout: str, root: pathlib.Path, items: dict, spec: world.WorldSpec) -> None:
  if layout == 'msrvtt':
    official = {'train': 'train', 'val': 'validate', 'test': 'test'}
    videos, sentences = [], []
    for split, rows in items.items():
      for _, stem, caps in rows:
        videos.append({'video_id': stem, 'split': official[split]})
        sentences += [{'video_id': stem, 'caption': c, 'sen_id': len(sentences) + k}
                      for k, c in enumerate(caps)]
    (root / 'MSRVTT_data.json').write_text(json.dumps({'videos': videos,
                                                       'sentences': sentences}))
    with open(root / 'MSRVTT_JSFUSION_test.csv', 'w', newline='') as f:
      w = csv.writer(f)
      w.writerow(['key', 'vid_key', 'video_id', 'sentence'])
      for n, (_, stem, caps) in enumerate(items.get('test', [])):
        w.writerow([f'ret{n}', f'msr{n}', stem, caps[0]])
  elif layout == 'videocc3m':
    with open(root / 'video_cc_public.csv', 'w', newline='') as f:
      w = csv.writer(f)
      for _, stem, caps in items.get('train', []):
        w.writerow([stem, 0, int(spec.duration_s * 1e6), caps[0]])
  elif layout == 'audiocaps':
    for split, rows in items.items():
      with open(root / f'{split}.csv', 'w', newline='') as f:
        w = csv.writer(f)
        w.writerow(['audiocap_id', 'youtube_id', 'start_time', 'caption'])
        n = 0
        for _, stem, caps in rows:
          for c in caps:
            w.writerow([f'{stem}-{n}', stem, 0, c])
            n += 1
  elif layout == 'smit':
    for split, rows in items.items():
      with open(root / f'{split}.csv', 'w', newline='') as f:
        w = csv.writer(f)
        w.writerow(['video_id', 'video', 'spoken_caption', 'transcript'])
        for _, stem, caps in rows:
          w.writerow([stem, f'videos/{stem}.mp4', f'spoken/{stem}.wav', caps[0]])
  elif layout == 'clotho':
    for split, rows in items.items():
      folder = {'train': 'development', 'val': 'validation', 'test': 'evaluation'}[split]
      with open(root / f'clotho_captions_{folder}.csv', 'w', newline='') as f:
        w = csv.writer(f)
        w.writerow(['file_name'] + [f'caption_{k}' for k in range(1, 6)])
        for _, stem, caps in rows:
          w.writerow([f'{stem}.wav'] + (caps + caps * 5)[:5])
