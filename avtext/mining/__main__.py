"""`python -m avtext.mining`: run the VideoCC mining pipeline (see avtext.mining.pipeline)."""
import argparse
import json
import logging

from avtext.mining import pipeline
from avtext.mining import runners
from avtext.mining import search


def main(argv=None):
  p = argparse.ArgumentParser(
      description='Mine video clips for image captions (VideoCC §3.1) with Apache Beam. '
      'Unrecognised flags are Beam pipeline options (--runner, --direct_num_workers, ...).')
  p.add_argument('--seeds', required=True, help='seeds.tsv: seed_id, image path, caption')
  p.add_argument('--videos', required=True, help='directory of corpus videos')
  p.add_argument('--embedder', required=True, help='run:DIR[@STEP] or callable:MODULE:NAME')
  p.add_argument('--out', required=True)
  d = pipeline.MiningConfig()
  p.add_argument('--tau', type=float, default=d.tau)
  p.add_argument('--top_k', type=int, default=d.top_k)
  p.add_argument('--clip_seconds', type=float, default=d.clip_seconds)
  p.add_argument('--frames_hz', type=float, default=d.frames_hz)
  p.add_argument('--all_frames', action='store_true',
                 help='let a seed match several frames of one video (default: one per video)')
  p.add_argument('--tau_grid', default=','.join(map(str, d.tau_grid)))
  p.add_argument('--shard_videos', type=int, default=d.shard_videos,
                 help='videos per shard: one FAISS index each, searched by every seed')
  p.add_argument('--shard_seeds', type=int, default=d.shard_seeds,
                 help='seeds per shard: a worker holds one seed shard at a time')
  p.add_argument('--seed_features', default=None,
                 help='a [num_seeds, D] .npy of precomputed seed vectors, row i = line i '
                 'of --seeds, used instead of embedding the seed images')
  p.add_argument('--dask_address', default=None,
                 help='with --runner=DaskRunner: HOST:PORT of an existing Dask scheduler')
  p.add_argument('--dask_local_workers', type=int, default=None,
                 help='with --runner=DaskRunner: start a local Dask cluster of N worker '
                 'processes for the run')
  p.add_argument('--exact_max_frames', type=int, default=d.index.exact_max_frames)
  p.add_argument('--approx', choices=('hnsw', 'ivf'), default=d.index.approx)
  p.add_argument('--hnsw_ef_search', type=int, default=d.index.hnsw_ef_search)
  p.add_argument('--ivf_nprobe', type=int, default=d.index.ivf_nprobe)
  p.add_argument('--recall_sample', type=int, default=d.recall_sample)
  p.add_argument('--embed_batch', type=int, default=d.embed_batch)
  p.add_argument('--image_size', default=None, help='H,W to resize frames and seed images to')
  a, beam_args = p.parse_known_args(argv)
  if not any(x.startswith('--runner') for x in beam_args):
    # The direct runner's engine itself: Beam's DirectRunner first tries Prism, a binary
    # it downloads from GitHub at run time, and falls back to this one.
    beam_args = ['--runner=FnApiRunner'] + beam_args
    if not any(x.startswith('--direct_num_workers') for x in beam_args):
      beam_args += ['--direct_num_workers=2']
    if not any(x.startswith('--direct_running_mode') for x in beam_args):
      beam_args += ['--direct_running_mode=multi_processing']
  cfg = pipeline.MiningConfig(
      tau=a.tau, top_k=a.top_k, clip_seconds=a.clip_seconds, frames_hz=a.frames_hz,
      one_per_video=not a.all_frames,
      tau_grid=tuple(float(t) for t in a.tau_grid.split(',') if t),
      shard_videos=a.shard_videos, shard_seeds=a.shard_seeds,
      index=search.IndexConfig(exact_max_frames=a.exact_max_frames, approx=a.approx,
                               hnsw_ef_search=a.hnsw_ef_search, ivf_nprobe=a.ivf_nprobe),
      recall_sample=a.recall_sample, embed_batch=a.embed_batch,
      image_size=tuple(int(x) for x in a.image_size.split(',')) if a.image_size else None)
  logging.basicConfig(level=logging.INFO, format='%(asctime)s %(levelname)s %(message)s')
  # Beam's own INFO lines (and its relay of each worker's log, which the workers also
  # print themselves) would bury the pipeline's progress and skip messages.
  logging.getLogger('apache_beam').setLevel(logging.WARNING)
  with runners.beam_args_for(beam_args, dask_address=a.dask_address,
                             dask_local_workers=a.dask_local_workers) as beam_args:
    info = pipeline.build_and_run(a.seeds, a.videos, a.embedder, a.out, cfg, beam_args,
                                  seed_features=a.seed_features)
  stats = info['stats']
  print(f"mined {a.out}: {stats['videos_searched']}/{stats['videos_listed']} videos searched, "
        f"skipped {stats['skipped'] or 'none'}; {info['frames']} frames in {info['seconds']:.1f} s")
  print('tau   matches  clips  videos  captions  precision')
  for row in stats['per_tau']:
    prec = row.get('precision')
    print(f"{row['tau']:.2f}  {row['matches']:7d}  {row['clips']:5d}  {row['videos']:6d}  "
          f"{row['captions']:8d}  {'-' if prec is None else f'{100 * prec:.1f} %'}")
  if info['peak_worker_rss_mb'] is not None:
    driver = next(w['peak_rss_mb'] for w in info['workers'] if w['worker'] == 'driver')
    print(f"peak memory (RSS): {info['peak_worker_rss_mb']:.0f} MiB in the largest of "
          f"{len(info['workers']) - 1} worker processes, {driver:.0f} MiB in this one "
          "(run.json)")
  if info['approx_recall'] is not None:
    print(f"approximate index recall vs exact: {100 * info['approx_recall']:.1f} %")
  print(json.dumps({'csv': f'{a.out}/videocc.csv', 'dataset': f'{a.out}/dataset.json'}))


if __name__ == '__main__':
  main()
