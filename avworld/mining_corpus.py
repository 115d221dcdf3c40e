r"""Write the synthetic mining world (`avworld.mining`) as files to mine.

    python -m avworld.tools.mining_world --out=DIR --num_seeds=2000 --num_videos=200 \
        [--faults=truncated,empty,not_video,audio_only,no_audio,short]

DIR/seeds/seeds.tsv + DIR/seeds/<seed id>.png   the seed images and captions
DIR/videos/<video id>.mp4                        the corpus (H.264 + AAC, 25 fps, 16 kHz)
DIR/videos/world.json                            the world's parameters and the id ->
                                                 index maps: the ground truth the
                                                 pipeline's precision is measured with
                                                 (`CorpusTruth`, opened by its format
                                                 through `avtext.data.ground_truth`)

`faults` replaces the last videos of the corpus, one per fault, with bad files the
pipeline must count rather than crash on (the first five are skipped, the last kept):
  truncated   the video's file cut to 60 % of its bytes, written with its index first
              (faststart), so it opens and its frames stop early
  empty       zero bytes
  not_video   a text file named .mp4
  audio_only  an .mp4 with an AAC stream and no video stream
  short       the first 6 s of the video (< the 10 s clip length)
  no_audio    the video without its audio stream (kept and flagged)
Writing is deterministic and skips files that already exist with the same world.json.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

import numpy as np
from tqdm import tqdm

from avtext import atomic
from avtext.data import ground_truth
from avworld import mining
from avworld import world

FAULTS = ('truncated', 'empty', 'not_video', 'audio_only', 'short', 'no_audio')  # video_io's
# /2: the world has `seed_caption_motion`; a /1 world.json was written before it, by a world
# whose seed captions could state motion.
FORMAT = 'avtext.mining_world/2'


def world_meta(w: mining.MiningWorld, faults: tuple[str, ...]) -> dict:
  params = dataclasses.asdict(w)
  params['spec'] = dataclasses.asdict(w.spec)
  return {'format': FORMAT, 'world': params, 'faults': list(faults),
          'seeds': {w.seed_id(i): i for i in range(w.num_seeds)},
          'videos': {w.video_id(i): i for i in range(w.num_videos)}}


def world_from_meta(meta: dict) -> mining.MiningWorld:
  params = dict(meta['world'])
  if meta.get('format') == 'avtext.mining_world/1':
    params.setdefault('seed_caption_motion', True)
  spec = world.WorldSpec(**{k: tuple(v) if isinstance(v, list) else v
                            for k, v in params.pop('spec').items()})
  return mining.MiningWorld(spec=spec, **{k: tuple(v) if isinstance(v, list) else v
                                          for k, v in params.items()})


class CorpusTruth:
  """The corpus of a world.json as a `ground_truth.CorpusTruth`: its videos by id, rendered
  as their files were written from, and whether a clip shows a seed's caption."""

  def __init__(self, meta: dict):
    self.world = world_from_meta(meta)
    self.fps, self.sample_rate = self.world.spec.fps, self.world.spec.sample_rate
    self._videos, self._seeds = dict(meta['videos']), dict(meta['seeds'])
    self._video_cache: dict[int, Any] = {}
    self._mention_cache: dict[int, dict] = {}

  def __repr__(self) -> str:
    return f'CorpusTruth({self.world!r})'

  def render_frames(self, video_id: str, times_s) -> np.ndarray:
    return self.world.render_frames(self._videos[video_id], times_s)

  def render_audio(self, video_id: str, start_sample: int, num_samples: int) -> np.ndarray:
    return self.world.render_audio(self._videos[video_id], start_sample, num_samples)

  def clip_fits(self, video_id: str, seed_id: str, start_s: float, end_s: float) -> bool:
    v, s = self._videos[video_id], self._seeds[seed_id]
    if v not in self._video_cache:
      self._video_cache[v] = self.world.video(v)
    if s not in self._mention_cache:
      self._mention_cache[s] = self.world.seed_mention(s)
    return mining.scenes_fit(self._video_cache[v], self._mention_cache[s], start_s, end_s)


@ground_truth.register_world('avtext.mining_world/', prefix=True)
def open_corpus(meta: dict) -> CorpusTruth:
  return CorpusTruth(meta)


def _write_file(path: pathlib.Path, kind: str | None, w: mining.MiningWorld, index: int
                ) -> None:
  """Video `index` as an mp4, or as the bad file `kind` (module docstring) stands for."""
  from avtext.data import video_io  # pylint: disable=g-import-not-at-top
  spec = w.spec
  if kind == 'audio_only':  # 5 s of sound, no frames
    video_io.write_fault(path, kind, np.zeros((0, 2, 2, 3), np.uint8), spec.fps,
                         audio=w.render_audio(index, 0, 5 * spec.sample_rate),
                         sample_rate=spec.sample_rate)
    return
  if kind in ('empty', 'not_video'):
    video_io.write_fault(path, kind, np.zeros((0, 2, 2, 3), np.uint8), spec.fps)
    return
  seconds = w.video(index).duration_s
  n = int(round(seconds * spec.fps))
  frames = w.render_frames(index, np.arange(n) / spec.fps)
  audio = w.render_audio(index, 0, int(round(seconds * spec.sample_rate)))
  video_io.write_fault(path, kind, frames, spec.fps, audio=audio,
                       sample_rate=spec.sample_rate, short_s=6.0)


def _write_video(job) -> None:
  w, i, fault, videos_dir = job
  path = pathlib.Path(videos_dir) / f'{w.video_id(i)}.mp4'
  atomic.replace_with(path, lambda tmp: _write_file(tmp, fault, w, i), durable=False)


def write(out: str | pathlib.Path, w: mining.MiningWorld, faults: tuple[str, ...] = (),
          workers: int = 1) -> dict:
  """Write seeds, videos and world.json under out (module docstring); return the meta."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  unknown = set(faults) - set(FAULTS)
  if unknown:
    raise ValueError(f'faults: unknown {sorted(unknown)}; expected some of {FAULTS}')
  if len(faults) > w.num_videos:
    raise ValueError(f'{len(faults)} faults need at least as many videos, got {w.num_videos}')
  out = pathlib.Path(out)
  seeds_dir, videos_dir = out / 'seeds', out / 'videos'
  meta = world_meta(w, tuple(faults))
  meta_path = videos_dir / 'world.json'
  # Compared as JSON: the world's tuples (num_scenes, ...) come back from the file as lists.
  same = meta_path.exists() and json.loads(meta_path.read_text()) == json.loads(json.dumps(meta))
  if not same and meta_path.exists():
    raise FileExistsError(f'{out}: holds a different mining world; choose another --out or '
                          'delete it')
  seeds_dir.mkdir(parents=True, exist_ok=True)
  videos_dir.mkdir(parents=True, exist_ok=True)
  lines = []
  for i in tqdm(range(w.num_seeds), desc='seed images', unit='image'):
    sid = w.seed_id(i)
    png = seeds_dir / f'{sid}.png'
    if not png.exists():
      Image.fromarray(w.seed_image(i)).save(png)
    lines.append(f'{sid}\t{png.name}\t{w.seed_caption(i)}\n')
  (seeds_dir / 'seeds.tsv').write_text(''.join(lines))
  fault_of = {w.num_videos - len(faults) + k: f for k, f in enumerate(faults)}
  todo = [i for i in range(w.num_videos)
          if not (same and (videos_dir / f'{w.video_id(i)}.mp4').exists())]
  jobs = [(w, i, fault_of.get(i), str(videos_dir)) for i in todo]
  if workers > 1 and len(jobs) > 1:
    import concurrent.futures  # pylint: disable=g-import-not-at-top
    import multiprocessing  # pylint: disable=g-import-not-at-top
    with concurrent.futures.ProcessPoolExecutor(
        workers, mp_context=multiprocessing.get_context('spawn')) as pool:
      for _ in tqdm(pool.map(_write_video, jobs), total=len(jobs), desc='corpus videos',
                    unit='video'):
        pass
  else:
    for job in tqdm(jobs, desc='corpus videos', unit='video'):
      _write_video(job)
  atomic.write_text(meta_path, json.dumps(meta, indent=1, sort_keys=True) + '\n',
                    durable=False)
  return meta
