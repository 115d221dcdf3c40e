"""The mining pipeline's per-worker work, one function per Beam stage, free of Beam.

The stages (`avtext.mining.beam_graph` wires them) hand seed vectors to each other through
files under the run's staging directory (OUT/_beam/RUN), so a worker holds one seed shard
at a time, never the seed table:
  seed_shard         one seed shard's rows -> unit vectors (embedded, or rows of a
                     precomputed --seed_features .npy) -> seeds-J.npy, and their
                     fixed-point sum (`embed.fixed_point_sum`, for `--center=seed_mean`)
  decode_and_embed   one video -> its frames' unit vectors (or a skip record)
  search_video_shard one video shard's frames, one FAISS index, every seed shard file in
                     turn -> each seed's top_k matches in the shard (seeds and frames
                     centred first under `--center=seed_mean`: the seed shards' sums
                     give the mean, the same bits in every task)
  write_matches      a seed shard's merged matches -> matches-J.json

Every embedding call sees exactly `embed_batch` rows (`embed_fixed`), so a seed or frame
goes through the same computation whatever bundle or runner it lands in.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import pathlib
import socket
import sys
import time
from typing import Iterable, Sequence

import numpy as np

from avtext.mining import beam_files
from avtext.mining import embed
from avtext.mining import search as search_lib

_EMBEDDERS: dict[str, embed.Embedder] = {}
_PEAK_RSS_WRITTEN: dict[str, float] = {}


def shard_of(video_id: str, num_shards: int) -> int:
  """The video shard of `video_id`, one of `num_shards`."""
  return int(hashlib.sha1(video_id.encode()).hexdigest()[:8], 16) % num_shards


def embedder(name: str) -> embed.Embedder:
  """The process' one copy of embedder `name` (unit rows; a tower compiles once per
  worker process, not once per bundle: the DaskRunner sets DoFns up per partition)."""
  if name not in _EMBEDDERS:
    _EMBEDDERS[name] = embed.resolve(name)
  return _EMBEDDERS[name]


def embed_fixed(f: embed.Embedder, x: np.ndarray, batch: int) -> np.ndarray:
  """f on the rows of x in calls of exactly `batch` rows, the last one padded with copies
  of its first row, with one BLAS / OpenMP thread: a compiled f (XLA) sees one shape,
  and a row's vector depends neither on how many rows shared its call nor on the
  runner (OpenBLAS's float32 GEMM rounds differently on 1 and 2 threads, and Dask's
  workers default to 1, Beam's to all cores)."""
  import threadpoolctl  # pylint: disable=g-import-not-at-top
  out = []
  with threadpoolctl.threadpool_limits(limits=1):
    for a in range(0, len(x), batch):
      chunk = x[a:a + batch]
      pad = batch - len(chunk)
      if pad:
        chunk = np.concatenate([chunk, np.repeat(chunk[:1], pad, 0)])
      out.append(np.asarray(f(chunk), np.float32)[:batch - pad])
  return np.concatenate(out) if out else np.zeros((0, 0), np.float32)


def peak_rss_mb() -> float:
  """This process' peak resident memory so far, MiB.

  On Linux this is the process' own high-water mark (VmHWM). getrusage's ru_maxrss is not:
  Linux carries it across fork and exec, so a Dask or Beam worker started by a large
  driver would report the driver's peak as its own.
  """
  try:
    with open('/proc/self/status') as f:
      for line in f:
        if line.startswith('VmHWM:'):
          return int(line.split()[1]) / 2**10  # kB
  except OSError:
    pass
  import resource  # pylint: disable=g-import-not-at-top
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return peak / (2**20 if sys.platform == 'darwin' else 2**10)  # bytes on macOS, KiB on Linux


def note_peak_rss(staging: str) -> None:
  """Record this process' peak resident memory so far in STAGING/workers/HOST-PID.json
  (rewritten when it grew): how the driver learns each worker's peak on any runner."""
  peak = peak_rss_mb()
  if peak <= _PEAK_RSS_WRITTEN.get(staging, 0):
    return
  _PEAK_RSS_WRITTEN[staging] = peak
  worker = f'{socket.gethostname()}-{os.getpid()}'
  beam_files.write_bytes(beam_files.join(staging, f'workers/{worker}.json'),
                         json.dumps({'worker': worker, 'peak_rss_mb': peak}).encode())


# ------------------------------------------------------------------ seeds
def npy_header(path: str) -> tuple[tuple[int, ...], np.dtype, int]:
  """(shape, dtype, data offset) of a .npy file, local or remote, read from its header."""
  from apache_beam.io.filesystems import FileSystems  # pylint: disable=g-import-not-at-top
  with FileSystems.open(path, compression_type='uncompressed') as f:
    version = np.lib.format.read_magic(f)
    read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
            else np.lib.format.read_array_header_2_0)
    shape, fortran, dtype = read(f)
    offset = f.tell()
  if fortran or len(shape) != 2 or dtype not in (np.float32, np.float64):
    raise ValueError(f'--seed_features {path}: expected a C-order float32/64 [num_seeds, D] '
                     f'array, got {dtype} {shape}{" (Fortran order)" if fortran else ""}')
  return shape, dtype, offset


def read_npy_rows(path: str, start: int, stop: int) -> np.ndarray:
  """Rows [start, stop) of a 2-d .npy without reading the rest of it."""
  from apache_beam.io.filesystems import FileSystems  # pylint: disable=g-import-not-at-top
  shape, dtype, offset = npy_header(path)
  row = shape[1] * dtype.itemsize
  with FileSystems.open(path, compression_type='uncompressed') as f:
    f.seek(offset + start * row)
    data = f.read((stop - start) * row)
  return np.frombuffer(data, dtype).reshape(stop - start, shape[1])


def seed_shard(staging: str, shard: int, start: int, stop: int, paths: Sequence[str] | None,
               embedder_name: str, seed_features: str | None, cfg
               ) -> tuple[int, int, str, np.ndarray, int, tuple[int, ...]]:
  """Seed rows [start, stop) -> their unit vectors in STAGING/seeds-SHARD.npy; (shard,
  start, the file, the vectors' `embed.fixed_point_sum`, the number of seeds embedded,
  the rows skipped). The vectors come from f on the seed images (`paths`), `embed_batch`
  images at a time, or from rows of the precomputed seed_features array (paths None).
  A seed image that is missing or does not decode is skipped: its row is zeros, left out
  of the sum and of every search, and recorded in STAGING/seed_skips-SHARD.json
  (`seed_skips`). One task writes a whole shard, so seed vectors never pass through a
  shuffle and a worker holds one shard (~3 copies of it at the write) whatever the
  number of seeds."""
  bad: list[int] = []
  if seed_features:
    vecs = embed.l2_normalize(read_npy_rows(seed_features, start, stop))
  else:
    skips, rows, blocks = [], [], []
    for a in range(0, stop - start, cfg.embed_batch):
      images = []
      for r, p in enumerate(paths[a:a + cfg.embed_batch], start + a):
        try:
          images.append(beam_files.load_image(p, cfg.image_size))
          rows.append(r)
        except beam_files.ImageReadError as e:
          bad.append(r)
          skips.append({'seed_row': r, 'path': e.path, 'reason': e.reason, 'detail': e.detail})
      shapes = {im.shape for im in images}
      if len(shapes) > 1:
        raise ValueError(f'seed images differ in size {sorted(shapes)[:3]}; pass '
                         '--image_size=H,W')
      if images:
        blocks.append(embed_fixed(embedder(embedder_name), np.stack(images), cfg.embed_batch))
    dim = blocks[0].shape[1] if blocks else 0
    vecs = np.zeros((stop - start, dim), np.float32)
    if blocks:
      vecs[np.asarray(rows) - start] = np.concatenate(blocks)
    if skips:
      beam_files.write_bytes(beam_files.join(staging, f'seed_skips-{shard:06d}.json'),
                             json.dumps(skips).encode())
  path = beam_files.join(staging, f'seeds-{shard:06d}.npy')
  vecs = np.ascontiguousarray(vecs, np.float32)
  total = embed.fixed_point_sum(vecs)  # the skipped rows are zeros: they add nothing
  buf = io.BytesIO()
  np.save(buf, vecs)
  del vecs
  beam_files.write_bytes(path, buf.getbuffer())
  note_peak_rss(staging)
  return shard, start, path, total, stop - start - len(bad), tuple(bad)


def seed_skips(staging: str) -> list[dict]:
  """Every seed_shard's skipped seeds: [{seed_row, path, reason, detail}], by row."""
  found = []
  for path in beam_files.match(beam_files.join(staging, 'seed_skips-*.json')):
    found += json.loads(beam_files.read_bytes(path))
  return sorted(found, key=lambda s: s['seed_row'])


def seed_mean(seed_shards: Sequence[tuple]) -> np.ndarray:
  """float32 [D]: the mean seed vector, from every seed shard's (`seed_shard`) sum."""
  return embed.mean_from_sums(sum(s[3] for s in seed_shards), sum(s[4] for s in seed_shards))


def load_npy(path: str) -> np.ndarray:
  if not beam_files.is_remote(path):
    return np.load(path, allow_pickle=False)
  return np.load(io.BytesIO(beam_files.read_bytes(path)), allow_pickle=False)


# ------------------------------------------------------------------ videos
def decode_and_embed(video_id: str, path: str, embedder_name: str, cfg
                     ) -> tuple[dict | None, dict | None]:
  """(record, None) for a usable video, (None, skip) for a skipped one, where record
  holds id, path, duration, has_audio, frame times and unit frame vectors."""
  from avtext.data import video_io  # pylint: disable=g-import-not-at-top
  if beam_files.is_remote(path):  # PyAV reads local files: copy the video to the worker's disk
    import tempfile  # pylint: disable=g-import-not-at-top
    with tempfile.NamedTemporaryFile(suffix=pathlib.PurePosixPath(path).suffix) as tmp:
      tmp.write(beam_files.read_bytes(path))
      tmp.flush()
      record, skip = decode_and_embed(video_id, tmp.name, embedder_name, cfg)
    for r in (record, skip):
      if r is not None:
        r['path'] = path
    return record, skip
  try:
    info = video_io.probe(path)
    if not info.duration_s >= cfg.clip_seconds:
      return None, {'video_id': video_id, 'path': path, 'reason': 'short',
                    'detail': f'{info.duration_s:.2f} s < t = {cfg.clip_seconds} s'}
    times = video_io.sample_times(info.duration_s, cfg.frames_hz)
    frames = video_io.read_frames(path, times, size=cfg.image_size)
  except video_io.VideoReadError as e:
    return None, {'video_id': video_id, 'path': path, 'reason': e.reason, 'detail': e.detail}
  vecs = (embed_fixed(embedder(embedder_name), frames, cfg.embed_batch) if len(frames)
          else np.zeros((0, 1), np.float32))
  return {'video_id': video_id, 'path': path, 'duration_s': info.duration_s,
          'has_audio': info.has_audio, 'times': times.astype(np.float64),
          'vecs': np.asarray(vecs, np.float32)}, None


# ------------------------------------------------------------------ search
def recall_rows(num_seeds: int, sample: int) -> np.ndarray:
  """Evenly spaced seed rows whose exact answers measure an approximate index's recall."""
  if sample <= 0:
    return np.zeros(0, np.int64)
  return np.unique(np.linspace(0, num_seeds - 1, min(sample, num_seeds)).round().astype(np.int64))


def search_video_shard(shard: int, records: Sequence[dict],
                       seed_shards: Sequence[tuple], num_seeds: int, cfg,
                       staging: str) -> Iterable[tuple]:
  """One video shard against every seed shard (`seed_shard`'s tuples), one seed shard
  file in memory at a time; seeds and frames centred by the seed mean first when
  cfg.center is 'seed_mean'.

  Yields ('match', seed row, (sim, video id, frame time, duration, has_audio, path)) for
  each seed's top_k matches in this shard, then ('info', info): index kind, frames,
  build / search seconds, recall hits / total of an approximate index vs exact on the
  `recall_sample` seeds (the same rows whatever the seed sharding), and the
  `search.cosine_histogram` of those seeds against every frame of the shard."""
  records = sorted((r for r in records if len(r['times'])), key=lambda r: r['video_id'])
  info = {'video_shard': shard, 'videos': len(records), 'index': 'none', 'frames': 0,
          'queries': 0, 'seconds': 0.0, 'build_seconds': 0.0}
  if records and any(s[4] for s in seed_shards):
    mean = seed_mean(seed_shards) if cfg.center == 'seed_mean' else None
    frames = embed.centre(np.concatenate([r['vecs'] for r in records]), mean)
    frame_video = np.concatenate([np.full(len(r['times']), k) for k, r in enumerate(records)])
    times = np.concatenate([r['times'] for r in records])
    t0 = time.perf_counter()
    index, desc = search_lib.build_index(frames, cfg.index)
    info.update(index=desc, frames=len(frames), build_seconds=time.perf_counter() - t0)
    sample = recall_rows(num_seeds, cfg.recall_sample)
    kw = dict(tau=cfg.search_tau, top_k=cfg.top_k, one_per_video=cfg.one_per_video)
    for _, start, path, _, count, bad in sorted(seed_shards, key=lambda s: s[0]):
      if not count:  # every seed image of the shard was skipped
        continue
      seeds = embed.centre(load_npy(path), mean)
      found, shard_info = search_lib.search_shard(seeds, frames, frame_video, index=index, **kw)
      for row in bad:  # a skipped seed's zero row matches nothing
        found[row - start] = []
      info['seconds'] += shard_info['seconds']
      info['queries'] += len(seeds)
      rows = sample[(sample >= start) & (sample < start + len(seeds))] - start
      rows = rows[~np.isin(rows + start, bad)]
      if len(rows):
        hist = search_lib.cosine_histogram(seeds[rows], frames)
        info['cosine_hist'] = (hist + info.get('cosine_hist', 0)).tolist()
      if desc != 'flat' and len(rows):
        exact, exact_info = search_lib.search_shard(seeds[rows], frames, frame_video,
                                                    force_exact=True, **kw)
        for row, ex in zip(rows, exact):
          want = {(m.video, m.frame) for m in ex}
          info['recall_hits'] = info.get('recall_hits', 0) + len(
              want & {(m.video, m.frame) for m in found[row]})
          info['recall_total'] = info.get('recall_total', 0) + len(want)
        info['exact_seconds'] = info.get('exact_seconds', 0.0) + exact_info['seconds']
        info['recall_queries'] = info.get('recall_queries', 0) + len(rows)
      for row, matches in enumerate(found):
        for m in matches:
          r = records[m.video]
          yield 'match', start + row, (m.sim, r['video_id'], float(times[m.frame]),
                                       r['duration_s'], r['has_audio'], r['path'])
      del seeds, found
  note_peak_rss(staging)
  yield 'info', info


def write_matches(staging: str, shard: int, tops: Iterable[tuple[int, list]]) -> str:
  """A seed shard's merged [(seed row, top matches)] -> STAGING/matches-SHARD.json."""
  rows = [[row, [list(m) for m in top]] for row, top in sorted(tops, key=lambda t: t[0])]
  path = beam_files.join(staging, f'matches-{shard:06d}.json')
  beam_files.write_bytes(path, json.dumps(rows).encode())
  note_peak_rss(staging)
  return path
