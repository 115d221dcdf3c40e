"""The mining pipeline's output files, statistics (Fig. 5, Fig. 8) and plots.

out/
  videocc.csv      the clips at τ in VideoCC's public layout, no header, one per line:
                   video id, start µs, end µs, caption (csv quoting); sorted by seed id
                   then rank
  matches.jsonl    every match at the lowest threshold searched (min of τ and the τ grid):
                   seed_id, caption, video_id, path, sim, frame_s, start_us, end_us,
                   has_audio, rank
  skipped.jsonl    the videos skipped: video_id, path, reason (video_io.REASONS or
                   'short'), detail; then the seeds skipped (image missing or not
                   decodable): seed_id, path, reason ('missing', 'unreadable'), detail
  dataset.json     what the `videocc_mined` dataset reads: the CSV, the video id -> path
                   map, τ, and the world that wrote the corpus ('origin') when one did
  stats.json       per τ of the grid: matches, clips, videos, captions, seeds matched,
                   clips per caption (Fig. 8 histogram), and precision when the corpus
                   knows its truth (a world wrote it: `world.json` beside its videos,
                   `corpus_truth`);
                   skip counts by reason (videos: skipped, seeds: seeds_skipped);
                   random_pairs: the cosine quantiles of the
                   `recall_sample` seeds against every frame (the embedder's scale for
                   unrelated pairs, to set τ by); the same for two runs of the same command
  run.json         wall time, video shards (index kind, frames, build and search
                   seconds, recall of the approximate index vs exact), the peak resident
                   memory of each worker process and of the driver ('driver'; the same
                   process as the workers on an in-process runner) - the only file that
                   varies between runs
  plots/matches_vs_tau.png, plots/clips_per_caption.png
"""
from __future__ import annotations

import collections
import csv
import dataclasses
import io
import json
import pathlib
from typing import Sequence

import numpy as np

from avtext import atomic
from avtext.data import ground_truth
from avtext.mining import beam_files

CSV_NAME = 'videocc.csv'
DATASET_FORMAT = 'avtext.videocc_mined/1'


def clip_bounds(centre_s: float, duration_s: float, clip_s: float) -> tuple[float, float]:
  """[start, end) of a clip of clip_s centred at centre_s, shifted inside [0, duration]."""
  if duration_s < clip_s:
    raise ValueError(f'clip_bounds: video of {duration_s:.2f} s is shorter than the clip '
                     f'({clip_s} s)')
  start = min(max(centre_s - clip_s / 2, 0.0), duration_s - clip_s)
  return start, start + clip_s


def _clip_rows(matches: Sequence, captions: dict, cfg) -> list[dict]:
  rows = []
  ranks: dict[str, int] = collections.Counter()
  for sid, (sim, vid, frame_s, duration, has_audio, path) in sorted(
      matches, key=lambda m: (m[0], -m[1][0], m[1][1], m[1][2])):
    start, end = clip_bounds(frame_s, duration, cfg.clip_seconds)
    rows.append({'seed_id': sid, 'caption': captions[sid], 'video_id': vid, 'path': path,
                 'sim': round(float(sim), 6), 'frame_s': round(float(frame_s), 6),
                 'start_us': int(round(start * 1e6)), 'end_us': int(round(end * 1e6)),
                 'has_audio': bool(has_audio), 'rank': ranks[sid]})
    ranks[sid] += 1
  return rows


def stats_at(rows: Sequence[dict], tau: float, top_k: int, truth=None) -> dict:
  """Fig. 5 / Fig. 8 numbers of the matches >= tau (rows from the lowest threshold)."""
  kept = [r for r in rows if r['sim'] >= tau and r['rank'] < top_k]
  clips = {(r['video_id'], r['start_us'], r['end_us']) for r in kept}
  per_caption = collections.Counter(r['caption'] for r in kept)
  out = {'tau': tau, 'matches': len(kept), 'clips': len(clips),
         'videos': len({r['video_id'] for r in kept}),
         'captions': len(per_caption), 'seeds': len({r['seed_id'] for r in kept}),
         'clips_per_caption_mean': (float(np.mean(list(per_caption.values())))
                                    if per_caption else 0.0),
         'clips_per_caption_hist': {str(k): v for k, v in sorted(
             collections.Counter(per_caption.values()).items())}}
  if truth is not None:
    fits = [truth(r) for r in kept]
    out['precision'] = float(np.mean(fits)) if fits else None
    out['precision_matched_frame'] = (float(np.mean([truth(r, frame_only=True) for r in kept]))
                                      if kept else None)
  return out


RANDOM_PAIR_QUANTILES = (0.5, 0.9, 0.99, 0.999, 0.9999)


def random_pairs(shards: Sequence[dict]) -> dict | None:
  """The cosine scale of (sample seed, frame) pairs, nearly all unrelated
  (`search.cosine_histogram`): their number and quantiles, from the shards' histograms;
  None when no shard had frames."""
  hists = [s['cosine_hist'] for s in shards if 'cosine_hist' in s]
  if not hists:
    return None
  from avtext.mining import search  # pylint: disable=g-import-not-at-top
  total = np.sum(np.asarray(hists, np.int64), axis=0)
  return {'pairs': int(total.sum()),
          'cosine_quantiles': {f'{100 * q:g}': search.cosine_quantile(total, q)
                               for q in RANDOM_PAIR_QUANTILES}}


def corpus_truth(videos_dir: str | pathlib.Path):
  """(truth(row, frame_only=False), the world's meta) for a corpus a world wrote (its
  world.json, `ground_truth.world_meta`), or None for any other corpus."""
  meta = ground_truth.world_meta(videos_dir)
  if meta is None:
    return None
  world = ground_truth.open_world(meta, where=f'{videos_dir}/{ground_truth.WORLD_FILE}',
                                  kind=ground_truth.CorpusTruth)
  memo: dict[tuple, bool] = {}

  def truth(row: dict, frame_only: bool = False) -> bool:
    key = (row['video_id'], row['seed_id'], row['start_us'], row['end_us'], row['frame_s'],
           frame_only)
    if key not in memo:
      start, end = ((row['frame_s'], row['frame_s'] + 1e-9) if frame_only
                    else (row['start_us'] / 1e6, row['end_us'] / 1e6))
      memo[key] = world.clip_fits(row['video_id'], row['seed_id'], start, end)
    return memo[key]

  return truth, meta


def write(out: str | pathlib.Path, **kwargs) -> dict:
  """Write every output file (module docstring) under `out`, local or remote (written
  locally, then copied with Beam's FileSystems); return run info (run.json)."""
  if not beam_files.is_remote(str(out)):
    return _write(pathlib.Path(out), **kwargs)
  import tempfile  # pylint: disable=g-import-not-at-top
  from apache_beam.io.filesystems import FileSystems  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryDirectory() as tmp:
    info = _write(pathlib.Path(tmp), **kwargs)
    for f in sorted(pathlib.Path(tmp).rglob('*')):
      if f.is_file():
        with FileSystems.create(f"{str(out).rstrip('/')}/{f.relative_to(tmp).as_posix()}") as g:
          g.write(f.read_bytes())
  return info


def _write(out_dir: pathlib.Path, *, cfg, seeds, captions, videos, matches, skipped, shards,
           seconds: float, videos_dir: str, embedder: str, workers: Sequence[dict] = (),
           seed_skips: Sequence[dict] = ()) -> dict:
  # Each file whole or not at all (avtext.atomic; driver-side only).
  out_dir.mkdir(parents=True, exist_ok=True)
  rows = _clip_rows(matches, captions, cfg)
  at_tau = [r for r in rows if r['sim'] >= cfg.tau]
  buf = io.StringIO()
  writer = csv.writer(buf, lineterminator='\n')
  for r in at_tau:
    writer.writerow([r['video_id'], r['start_us'], r['end_us'], r['caption']])
  atomic.write_text(out_dir / CSV_NAME, buf.getvalue())
  atomic.write_text(out_dir / 'matches.jsonl',
                    ''.join(json.dumps(r, sort_keys=True) + '\n' for r in rows))
  skipped = sorted(skipped, key=lambda s: s['video_id'])
  seed_skips = sorted(seed_skips, key=lambda s: s['seed_id'])
  atomic.write_text(out_dir / 'skipped.jsonl', ''.join(
      json.dumps(s, sort_keys=True) + '\n' for s in [*skipped, *seed_skips]))
  found = corpus_truth(videos_dir)
  truth, origin = (found if found is not None else (None, None))
  taus = sorted(set(cfg.tau_grid) | {cfg.tau})
  no_audio = sorted({r['video_id'] for r in rows if not r['has_audio']})
  stats = {
      'config': json.loads(json.dumps(dataclasses.asdict(cfg))),
      'embedder': embedder,
      'seeds': len(seeds), 'videos_listed': len(videos),
      'videos_searched': len(videos) - len(skipped),
      'skipped': dict(sorted(collections.Counter(s['reason'] for s in skipped).items())),
      'seeds_skipped': dict(sorted(collections.Counter(s['reason'] for s in seed_skips).items())),
      'matched_videos_without_audio': len(no_audio),
      'per_tau': [stats_at(rows, t, cfg.top_k, truth) for t in taus],
      'random_pairs': random_pairs(shards),
  }
  atomic.write_text(out_dir / 'stats.json',
                    json.dumps(stats, indent=1, sort_keys=True) + '\n')
  used = {r['video_id'] for r in at_tau}
  dataset = {'format': DATASET_FORMAT, 'csv': CSV_NAME, 'tau': cfg.tau,
             'clip_seconds': cfg.clip_seconds,
             'videos': {vid: path if '://' in path else str(pathlib.Path(path).resolve())
                        for vid, path in videos if vid in used},
             'no_audio': [v for v in no_audio if v in used],
             'origin': origin}
  atomic.write_text(out_dir / 'dataset.json',
                    json.dumps(dataset, indent=1, sort_keys=True) + '\n')
  _plots(out_dir / 'plots', stats)
  recall_hits = sum(s.get('recall_hits', 0) for s in shards)
  recall_total = sum(s.get('recall_total', 0) for s in shards)
  run = {'seconds': seconds, 'shards': sorted(
      ({k: v for k, v in s.items() if k != 'cosine_hist'} for s in shards),
      key=lambda s: -s['frames']),
         'frames': sum(s['frames'] for s in shards),
         'search_seconds': sum(s['seconds'] for s in shards),
         'approx_recall': (recall_hits / recall_total) if recall_total else None,
         'workers': sorted(workers, key=lambda w: w['worker']),
         'peak_worker_rss_mb': max((w['peak_rss_mb'] for w in workers
                                    if w['worker'] != 'driver'), default=None)}
  atomic.write_text(out_dir / 'run.json',
                    json.dumps(run, indent=1, sort_keys=True) + '\n')
  return {**run, 'stats': stats}


def _plots(plot_dir: pathlib.Path, stats: dict) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  plot_dir.mkdir(parents=True, exist_ok=True)
  per = stats['per_tau']
  taus = [p['tau'] for p in per]
  fig, ax = plt.subplots(figsize=(5, 3.5))
  for key in ('matches', 'clips', 'videos', 'captions'):
    ax.plot(taus, [p[key] for p in per], marker='o', label=key)
  ax.set_xlabel('match threshold τ')
  ax.set_ylabel('count')
  ax.set_title('Mining statistics vs τ (VideoCC Fig. 5)')
  if any(p.get('precision') is not None for p in per):
    ax2 = ax.twinx()
    ax2.plot(taus, [100 * (p.get('precision') or 0) for p in per], 'k--', marker='s',
             label='precision %')
    ax2.set_ylabel('precision of clips (%)')
    ax2.set_ylim(0, 100)
    ax2.legend(loc='lower left', fontsize=8)
  ax.legend(loc='upper right', fontsize=8)
  fig.tight_layout()
  fig.savefig(plot_dir / 'matches_vs_tau.png', dpi=100, metadata={'Software': None})
  plt.close(fig)
  tau = stats['config']['tau']
  at = next(p for p in per if p['tau'] == tau)
  hist = {int(k): v for k, v in at['clips_per_caption_hist'].items()}
  fig, ax = plt.subplots(figsize=(5, 3.5))
  if hist:
    ax.bar(list(hist), list(hist.values()))
    ax.set_yscale('log')
  ax.set_xlabel('clips per caption')
  ax.set_ylabel('captions (log)')
  ax.set_title(f'Clips per caption at τ = {tau} (VideoCC Fig. 8)')
  fig.tight_layout()
  fig.savefig(plot_dir / 'clips_per_caption.png', dpi=100, metadata={'Software': None})
  plt.close(fig)
