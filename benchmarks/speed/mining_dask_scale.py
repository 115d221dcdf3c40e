r"""VideoCC mining at scale: wall time and peak worker memory on the direct runner and on a
local Dask cluster, and the per-frame costs that extrapolate to CC3M (issue 34).

    python -m benchmarks.speed.mining_dask_scale [--out=workdirs/bench/mining_dask_scale] \
        [--tower=workdirs/demo/video_pretrain] [--grid=full|small|none] [--skip_costs]

Prints markdown tables:
  1. `python -m avtext.mine` (a subprocess, as a user runs it) on a grid of corpus
     sizes: 100 / 1k / 10k videos at 10k seeds and 10k / 100k / 1M seeds at 100 videos,
     each on the direct runner (FnApiRunner, 2 worker processes) and on a 2-worker local
     Dask cluster (`--dask_local_workers=2`): wall time of the command, pipeline seconds,
     frames, matches, peak RSS of the largest worker process and of the driver.
     The videos: 100 short (12-24 s) 32x32 synthetic videos written once; the 1k and 10k
     corpora are symlinked copies of them under new names (so new ids and shards, the
     same decode work). f: a cheap 256-d embedder (`project256`, a fixed random
     projection of 8x8 thumbnails); the seeds: the world's 1000 seed images embedded by
     it, then Gaussian random 256-d vectors (`--seed_features`) up to the seed count.
  2. per-frame costs for the CC3M extrapolation: decode at 1 fps (64x64 H.264 with AAC,
     the demo world's format), the demo RGB tower on stills (if --tower exists), and the
     shard search (`common.mining.search_rows`: 1000 queries against 200k 256-d frames,
     flat, HNSW32, IVF).
--quick: the small grid's first cell, no per-frame costs. Rows: every cell of the grid and
the per-frame costs.
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

from absl import flags
import numpy as np

from benchmarks import common
from benchmarks.common import mining as mining_lib

_TOWER = flags.DEFINE_string("tower", "workdirs/demo/video_pretrain", "the stage-1 run (for "
                             "the per-frame cost of the demo tower)")
_GRID = flags.DEFINE_enum("grid", "full", ["full", "small", "none"], "the corpus grid")
_SKIP_COSTS = flags.DEFINE_bool("skip_costs", False, "no per-frame costs")
SYSTEM = "VideoCC mining"
_PROJECTION = np.random.default_rng(1234).normal(size=(8 * 8 * 3, 256)).astype(np.float32)


def project256(frames: np.ndarray) -> np.ndarray:
  """A cheap 256-d f for the scale grid: 8x8 block means of the frame, centred, through a
  fixed random projection (rows normalized by `avtext.mining.embed.resolve`)."""
  x = np.asarray(frames, np.float32) / 255.0 - 0.5
  n, h, w, c = x.shape
  thumb = x.reshape(n, 8, h // 8, 8, w // 8, c).mean(axis=(2, 4)).reshape(n, -1)
  return thumb @ _PROJECTION


EMBEDDER = 'callable:benchmarks.speed.mining_dask_scale:project256'


def base_world(scratch: pathlib.Path):
  from avworld import mining  # pylint: disable=g-import-not-at-top
  from avworld import mining_corpus  # pylint: disable=g-import-not-at-top
  from avworld import world  # pylint: disable=g-import-not-at-top
  w = mining.MiningWorld(num_seeds=1000, num_videos=100, seed_scene_rate=0.5,
                         num_scenes=(3, 4), scene_seconds=(4.0, 6.0),
                         spec=world.WorldSpec(height=32, width=32, fps=25, duration_s=10.0))
  root = scratch / 'base'
  mining_corpus.write(root, w, (), workers=2)
  return root


def corpus(scratch: pathlib.Path, base: pathlib.Path, n: int) -> pathlib.Path:
  """n videos: the base videos under new names, as symlinks."""
  out = scratch / f'videos_{n}'
  if out.exists():
    return out
  tmp = scratch / f'videos_{n}.tmp'
  shutil.rmtree(tmp, ignore_errors=True)
  tmp.mkdir(parents=True)
  base_videos = sorted((base / 'videos').glob('*.mp4'))
  for k in range(n):
    (tmp / f'v{k:06d}.mp4').symlink_to(base_videos[k % len(base_videos)].resolve())
  tmp.rename(out)
  return out


def seeds(scratch: pathlib.Path, base: pathlib.Path, n: int) -> tuple[pathlib.Path, pathlib.Path]:
  """seeds.tsv and seed_features.npy of n seeds: the world's 1000, then random ones."""
  from avtext.mining import beam_files  # pylint: disable=g-import-not-at-top
  from avtext.mining import embed  # pylint: disable=g-import-not-at-top
  tsv, npy = scratch / f'seeds_{n}.tsv', scratch / f'seeds_{n}.npy'
  if tsv.exists() and npy.exists():
    return tsv, npy
  real = beam_files.read_seeds(base / 'seeds' / 'seeds.tsv')
  f = embed.resolve(EMBEDDER)
  vecs = [f(np.stack([beam_files.load_image(p, None) for _, p, _ in real]))]
  rng = np.random.default_rng(0)
  for a in range(len(real), n, 100_000):
    vecs.append(embed.l2_normalize(rng.normal(size=(min(100_000, n - a), 256))))
  np.save(npy, np.concatenate(vecs)[:n].astype(np.float32))
  lines = [f'{sid}\t{path}\t{cap}' for sid, path, cap in real[:n]]
  lines += [f'synthetic-{k:07d}\t-\trandom seed vector {k}' for k in range(len(real), n)]
  tsv.write_text('\n'.join(lines) + '\n')
  return tsv, npy


def mine(scratch, tsv, npy, videos, runner: str, out: pathlib.Path) -> dict:
  cmd = [sys.executable, '-m', 'avtext.mine', f'--seeds={tsv}', f'--seed_features={npy}',
         f'--videos={videos}', f'--embedder={EMBEDDER}', f'--out={out}', '--tau=0.5']
  cmd += (['--runner=DaskRunner', '--dask_local_workers=2'] if runner == 'dask'
          else ['--direct_num_workers=2'])
  t = time.perf_counter()
  proc = subprocess.run(cmd, cwd=common.REPO, capture_output=True, text=True)
  wall = time.perf_counter() - t
  if proc.returncode:
    raise RuntimeError(' '.join(cmd) + '\n' + proc.stderr[-4000:])
  run = json.loads((out / 'run.json').read_text())
  matches = sum(1 for _ in open(out / 'matches.jsonl'))
  driver = next(w['peak_rss_mb'] for w in run['workers'] if w['worker'] == 'driver')
  return dict(wall=wall, seconds=run['seconds'], frames=run['frames'], matches=matches,
              worker_rss=run['peak_worker_rss_mb'], driver_rss=driver,
              workers=len(run['workers']) - 1, csv=(out / 'videocc.csv').read_bytes())


def grid(kind, scratch, base):
  cells = ([(v, 10_000) for v in (100, 1000, 10_000)] + [(100, s) for s in (100_000, 1_000_000)]
           if kind == 'full' else [(100, 10_000), (1000, 10_000), (100, 100_000)])
  if common.quick():
    cells = cells[:1]
  table = ('`python -m avtext.mine` on 12-24 s 32x32 videos, f = project256, direct runner '
           '(FnApiRunner) and a local Dask cluster, 2 workers each')
  print('\n| videos | seeds | runner | wall s (command) | pipeline s | frames | matches | '
        'peak worker RSS (MiB) | driver RSS (MiB) | CSV equal across runners |'
        '\n|---|---|---|---|---|---|---|---|---|---|', flush=True)
  for v, s in cells:
    tsv, npy = seeds(scratch, base, s)
    videos = corpus(scratch, base, v)
    got = {}
    for runner in ('direct', 'dask'):
      out = scratch / f'mined_{v}_{s}_{runner}'
      shutil.rmtree(out, ignore_errors=True)
      got[runner] = r = mine(scratch, tsv, npy, videos, runner, out)
      same = '' if runner == 'direct' else ('yes' if r['csv'] == got['direct']['csv'] else 'NO')
      print(f"| {v} | {s} | {runner} ({r['workers']} workers) | {r['wall']:.0f} | "
            f"{r['seconds']:.0f} | {r['frames']} | {r['matches']} | {r['worker_rss']:.0f} | "
            f"{r['driver_rss']:.0f} | {same} |", flush=True)
      shutil.rmtree(out)
    pair = lambda key: f"{got['direct'][key]:.0f} / {got['dask'][key]:.0f}"  # noqa: E731
    for column, value, unit in (('wall (command), direct / dask', pair('wall'), 's'),
                                ('pipeline, direct / dask', pair('seconds'), 's'),
                                ('frames', got['direct']['frames'], ''),
                                ('matches', got['direct']['matches'], ''),
                                ('peak worker RSS, direct / dask', pair('worker_rss'), 'MiB'),
                                ('driver RSS, direct / dask', pair('driver_rss'), 'MiB'),
                                ('CSV equal across runners', same, '')):
      common.record(SYSTEM, f'{v} videos, {s} seeds', value, unit=unit, table=table,
                    column=column)


def unit_costs(tower_run, scratch):
  """Per-frame decode and embed, per-query search: the inputs of the extrapolation."""
  from avtext.data import video_io  # pylint: disable=g-import-not-at-top
  from avworld import mining  # pylint: disable=g-import-not-at-top
  from avworld import mining_corpus  # pylint: disable=g-import-not-at-top
  from avtext.mining import embed  # pylint: disable=g-import-not-at-top
  from avtext.mining import beam_files  # pylint: disable=g-import-not-at-top
  root = scratch / 'demo_format'  # the demo world's 64x64, 64-144 s videos with AAC
  mining_corpus.write(root, mining.MiningWorld(num_seeds=10, num_videos=6), (), workers=2)
  frames, t_dec = [], 0.0
  for _, path in beam_files.list_videos(root / 'videos'):
    t = time.perf_counter()
    info = video_io.probe(path)
    x = video_io.read_frames(path, video_io.sample_times(info.duration_s, 1.0))
    t_dec += time.perf_counter() - t
    frames.append(x)
  frames = np.concatenate(frames)
  print(f'\ndecode at 1 fps, 64x64 H.264 + AAC, one process: {len(frames) / t_dec:.0f} '
        f'frames/s ({len(frames)} frames)')
  table = 'per-frame costs, one process (the inputs of the CC3M extrapolation)'
  common.record(SYSTEM, 'decode at 1 fps, 64x64 H.264 + AAC (the demo world\'s files)',
                len(frames) / t_dec, unit='frames/s', table=table, digits=3)
  if pathlib.Path(tower_run).exists():
    tower = embed.resolve(f'run:{tower_run}')
    tower(frames[:128])  # compile
    t = time.perf_counter()
    tower(frames)
    fps = len(frames) / (time.perf_counter() - t)
    print(f'RGB tower on stills (batch 128, compiled), one process: {fps:.0f} frames/s')
    common.record(SYSTEM, 'the demo RGB tower on stills (batch 128, compiled)', fps,
                  unit='frames/s', table=table, digits=3)
  rng = np.random.default_rng(0)
  centres = embed.l2_normalize(rng.normal(size=(2000, 256)))
  # 20k videos x 10 frames around 2000 topics; noise of norm ~0.3 (cosine ~0.95 to the
  # topic), as near-duplicate frames of one scene are.
  owner = np.repeat(np.arange(20_000), 10)
  noise = 0.3 / 16  # per dimension: norm 0.3 in 256-d
  vecs = embed.l2_normalize(centres[owner % 2000] + noise * rng.normal(size=(len(owner), 256)))
  queries = embed.l2_normalize(centres[:1000] + noise * rng.normal(size=(1000, 256)))
  rows = mining_lib.search_rows(queries, vecs, owner, '20k videos x 10 frames, 256-d')
  mining_lib.record_search(SYSTEM, 'shard search: 1000 queries, top 10 videos, 200k frames '
                           'around 2000 topics', rows)


def main(argv):
  del argv
  scratch = common.out_dir().resolve()
  print(f'{time.strftime("%Y-%m-%d")}, {os.cpu_count()} CPUs')
  kind = 'small' if common.quick() else _GRID.value
  if kind != 'none':
    grid(kind, scratch, base_world(scratch))
  if not (_SKIP_COSTS.value or common.quick()):
    unit_costs(_TOWER.value, scratch)


if __name__ == '__main__':
  common.main(main)
