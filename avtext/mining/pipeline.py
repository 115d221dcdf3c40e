r"""VideoCC mining (§3.1) as an Apache Beam pipeline: image captions -> video clips.

    python -m avtext.mining --seeds=SEEDS.tsv --videos=DIR --embedder=run:RUN_DIR \
        --out=OUT [--tau=0.6 --top_k=10 --clip_seconds=10] [Beam options]

Inputs
  seeds.tsv   one seed image per line: `seed_id <TAB> image path <TAB> caption` (the
              path relative to the file's directory; PNG/JPEG). CC3M users write it
              from the release TSV (caption, url) and the images they downloaded.
  videos      a directory; every file with a video extension (files.VIDEO_EXTENSIONS) under
              it, recursively, is a corpus video whose id is its path relative to the
              directory without the extension.

Stages (each a Beam transform; Reshuffle spreads the videos over workers)
  1. seed features f(x_seed): images -> embedder (`avtext.mining.embed`), batched.
  2. frames at `frames_hz` (1 fps) of each video -> f(x_v); a video that cannot be read
     (`video_io.REASONS`), or is shorter than the clip length t ('short'), is a
     counted, logged skip; a video without audio is counted ('no_audio') and kept,
     flagged, as VideoCC's AVR pads missing audio with zeros (app. C).
  3. videos are hashed into shards of ~`shard_videos`; each shard builds its own FAISS
     index over its frames and finds every seed's top_k matches >= tau there
     (`avtext.mining.search`); shards' lists are merged per seed into the global top_k
     (exact, as shards hold whole videos). Approximate shards also search
     `recall_sample` seeds exactly and report the approximate index's recall.
  4. each match becomes a clip of t = `clip_seconds` centred on the matched frame,
     shifted to stay inside the video, and takes the seed's caption.

The search runs at the lowest threshold of `tau_grid` and `tau`, so the statistics
for every τ of Fig. 5 come from one run (top_k of the matches >= τ is the matches >=
τ among the top_k at a lower threshold); the CSV and the dataset hold the clips at τ.

Outputs (`outputs.write`): videocc.csv (VideoCC's public layout, no header: video id,
start µs, end µs, caption), matches.jsonl (every match at the lowest threshold:
seed, caption, video, path, similarity, frame time, clip, has_audio), skipped.jsonl,
dataset.json (what `dataset.name="videocc_mined"` reads), stats.json (+ Fig. 5 / Fig. 8
plots as PNG under plots/) and run.json (timings, index kinds, recall; the only file
that differs between two runs of the same command).

Runners: the default is Beam's direct runner with `--direct_num_workers=2
--direct_running_mode=multi_processing`, named `--runner=FnApiRunner`: that is the engine
`--runner=DirectRunner` runs, after first trying Prism, a binary it would download from
GitHub at run time (nothing is fetched here; DirectRunner still works, logging the failed
download). Any Beam runner takes the standard options,
e.g. Dataflow (the embedder's run directory and the inputs must then be on GCS and
avtext installed on the workers, e.g. --setup_file=./setup.py):

    python -m avtext.mining --seeds=gs://B/cc3m/seeds.tsv --videos=gs://B/videos \
        --embedder=run:gs://B/runs/tower --out=gs://B/videocc \
        --runner=DataflowRunner --project=P --region=us-central1 \
        --temp_location=gs://B/tmp --setup_file=./setup.py --num_workers=64
    (Flink / Spark: --runner=FlinkRunner --flink_master=HOST:8081, --runner=SparkRunner)

Every path may be local or remote (gs://, s3://, ...: Beam's FileSystems): seeds.tsv,
the images, the video listing, the workers' hand-over files under OUT/_beam; a remote
video is copied to the worker's disk before PyAV decodes it. Only the local runner is
exercised here (tests and benchmarks); the remote runners are documented, not run.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import pathlib
import time
from typing import Sequence

import numpy as np

from avtext.mining import files
from avtext.mining import search as search_lib



@dataclasses.dataclass(frozen=True)
class MiningConfig:
  tau: float = 0.6  # §3.2.1: the chosen match threshold
  top_k: int = 10  # §3.1: top 10 matches per seed
  clip_seconds: float = 10.0  # §3.2.1: t = 10 s
  frames_hz: float = 1.0  # §3.1: frames at 1 fps
  one_per_video: bool = True  # see avtext.mining.search
  tau_grid: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8, 0.9)  # Fig. 5
  shard_videos: int = 256
  index: search_lib.IndexConfig = search_lib.IndexConfig()
  recall_sample: int = 256
  embed_batch: int = 128
  image_size: tuple[int, int] | None = None  # (H, W) frames and seed images are resized to

  @property
  def search_tau(self) -> float:
    return min((self.tau,) + tuple(self.tau_grid))


def shard_of(video_id: str, num_shards: int) -> int:
  return int(hashlib.sha1(video_id.encode()).hexdigest()[:8], 16) % num_shards


# ------------------------------------------------------------------ per-worker work
def embed_seed_batch(rows: Sequence[tuple[str, str, str]], embedder, size) -> list:
  images = [files.load_image(p, size) for _, p, _ in rows]
  shapes = {im.shape for im in images}
  if len(shapes) > 1:
    raise ValueError(f'seed images differ in size {sorted(shapes)[:3]}; pass --image_size=H,W')
  vecs = embedder(np.stack(images))
  return [(sid, np.asarray(v, np.float32)) for (sid, _, _), v in zip(rows, vecs)]


def decode_and_embed(video_id: str, path: str, embedder, cfg: MiningConfig
                     ) -> tuple[dict | None, dict | None]:
  """(record, None) for a usable video, (None, skip) for a skipped one, where record
  holds id, path, duration, has_audio, frame times and unit frame vectors."""
  from avtext.data import video_io  # pylint: disable=g-import-not-at-top
  if files.is_remote(path):  # PyAV reads local files: copy the video to the worker's disk
    import tempfile  # pylint: disable=g-import-not-at-top
    with tempfile.NamedTemporaryFile(suffix=pathlib.PurePosixPath(path).suffix) as tmp:
      tmp.write(files.read_bytes(path))
      tmp.flush()
      record, skip = decode_and_embed(video_id, tmp.name, embedder, cfg)
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
  vecs = embedder(frames) if len(frames) else np.zeros((0, 1), np.float32)
  return {'video_id': video_id, 'path': path, 'duration_s': info.duration_s,
          'has_audio': info.has_audio, 'times': times.astype(np.float64),
          'vecs': np.asarray(vecs, np.float32)}, None


def search_records(records: Sequence[dict], seed_ids: Sequence[str], seed_vecs: np.ndarray,
                   cfg: MiningConfig, *, recall_rows: np.ndarray | None = None
                   ) -> tuple[list[tuple[str, tuple]], dict]:
  """One shard: [(seed id, (sim, video id, frame time, duration, has_audio, path))] and
  info (index, frames, seconds, recall hits / total when approximate)."""
  records = sorted(records, key=lambda r: r['video_id'])
  records = [r for r in records if len(r['times'])]
  if not records:
    return [], {'index': 'none', 'frames': 0, 'seconds': 0.0}
  frames = np.concatenate([r['vecs'] for r in records])
  frame_video = np.concatenate([np.full(len(r['times']), k) for k, r in enumerate(records)])
  times = np.concatenate([r['times'] for r in records])
  kw = dict(tau=cfg.search_tau, top_k=cfg.top_k, one_per_video=cfg.one_per_video)
  found, info = search_lib.search_shard(seed_vecs, frames, frame_video,
                                        index_cfg=cfg.index, **kw)
  if info['index'] != 'flat' and recall_rows is not None and len(recall_rows):
    exact, exact_info = search_lib.search_shard(seed_vecs[recall_rows], frames, frame_video,
                                                force_exact=True, **kw)
    hits = total = 0
    for row, ex in zip(recall_rows, exact):
      want = {(m.video, m.frame) for m in ex}
      hits += len(want & {(m.video, m.frame) for m in found[row]})
      total += len(want)
    info.update(recall_hits=hits, recall_total=total, exact_seconds=exact_info['seconds'],
                recall_queries=len(recall_rows))
  out = []
  for row, matches in enumerate(found):
    for m in matches:
      r = records[m.video]
      out.append((seed_ids[row], (m.sim, r['video_id'], float(times[m.frame]),
                                  r['duration_s'], r['has_audio'], r['path'])))
  info['queries'] = len(seed_vecs)
  return out, info


def recall_rows(num_seeds: int, sample: int) -> np.ndarray:
  """Evenly spaced seed rows whose exact answers measure an approximate index's recall."""
  if sample <= 0:
    return np.zeros(0, np.int64)
  return np.unique(np.linspace(0, num_seeds - 1, min(sample, num_seeds)).round().astype(np.int64))


# ------------------------------------------------------------------ the Beam pipeline
def build_and_run(seeds_tsv: str, videos_dir: str, embedder_name: str, out: str,
                  cfg: MiningConfig, beam_args: Sequence[str] = ()) -> dict:
  """Run the pipeline; write the outputs (`outputs.write`); return run info."""
  import apache_beam as beam  # pylint: disable=g-import-not-at-top
  from apache_beam.options.pipeline_options import PipelineOptions  # pylint: disable=g-import-not-at-top
  from avtext.mining import outputs  # pylint: disable=g-import-not-at-top

  seeds = files.read_seeds(seeds_tsv)
  videos = files.list_videos(videos_dir)
  if not videos:
    raise ValueError(f'--videos {videos_dir}: no files with extensions {files.VIDEO_EXTENSIONS}')
  num_shards = max(1, -(-len(videos) // cfg.shard_videos))
  captions = {sid: cap for sid, _, cap in seeds}
  # The workers hand their results to this process through files under out/_beam
  # (Beam's FileSystems: a local path, or gs:// etc. on a remote runner).
  staging = files.join(str(out), '_beam')
  run_tag = hashlib.sha1(f'{time.time_ns()}'.encode()).hexdigest()[:8]

  class EmbedSeeds(beam.DoFn):

    def setup(self):
      from avtext.mining import embed  # pylint: disable=g-import-not-at-top
      self.embedder = embed.resolve(embedder_name)

    def process(self, batch):
      yield from embed_seed_batch(batch, self.embedder, cfg.image_size)

  class DecodeEmbed(beam.DoFn):
    SKIPPED = 'skipped'

    def infer_output_type(self, input_type):
      return beam.typehints.Tuple[int, beam.typehints.Any]  # main output; skips are tagged

    def setup(self):
      from avtext.mining import embed  # pylint: disable=g-import-not-at-top
      self.embedder = embed.resolve(embedder_name)
      self.done = 0

    def process(self, item):
      video_id, path = item
      record, skip = decode_and_embed(video_id, path, self.embedder, cfg)
      self.done += 1
      if self.done % 50 == 0:
        logging.info('mining: this worker decoded and embedded %d videos', self.done)
      if skip is not None:
        beam.metrics.Metrics.counter('mining', f'skipped_{skip["reason"]}').inc()
        logging.warning('mining: skipped %s (%s: %s)', video_id, skip['reason'],
                        skip['detail'])
        yield beam.pvalue.TaggedOutput(self.SKIPPED, skip)
        return
      beam.metrics.Metrics.counter('mining', 'videos').inc()
      beam.metrics.Metrics.counter('mining', 'frames').inc(len(record['times']))
      if not record['has_audio']:
        beam.metrics.Metrics.counter('mining', 'no_audio').inc()
        logging.warning('mining: %s has no audio stream (kept, flagged)', video_id)
      yield shard_of(video_id, num_shards), record

  class SearchShard(beam.DoFn):
    INFO = 'info'

    def process(self, item, seed_table):
      _, records = item
      ids, vecs = seed_table
      matches, info = search_records(list(records), ids, vecs, cfg,
                                     recall_rows=recall_rows(len(ids), cfg.recall_sample))
      for m in matches:
        yield m
      yield beam.pvalue.TaggedOutput(self.INFO, info)

  def seed_table(pairs):
    pairs = sorted(pairs, key=lambda p: p[0])
    return [p[0] for p in pairs], np.stack([p[1] for p in pairs])

  def write_list(items, name):
    files.write_bytes(files.join(staging, f'{run_tag}-{name}'),
                      json.dumps(items, sort_keys=True).encode())

  options = PipelineOptions(list(beam_args))
  t0 = time.perf_counter()
  with beam.Pipeline(options=options) as p:
    seed_vecs = (p | 'Seeds' >> beam.Create(seeds)
                 | 'BatchSeeds' >> beam.BatchElements(min_batch_size=cfg.embed_batch,
                                                      max_batch_size=cfg.embed_batch)
                 | 'EmbedSeeds' >> beam.ParDo(EmbedSeeds())
                 | 'SeedList' >> beam.combiners.ToList()
                 | 'SeedTable' >> beam.Map(seed_table))
    decoded = (p | 'Videos' >> beam.Create(videos)
               | 'Spread' >> beam.Reshuffle()
               | 'DecodeEmbed' >> beam.ParDo(DecodeEmbed()).with_outputs(
                   DecodeEmbed.SKIPPED, main='records'))
    searched = (decoded.records
                | 'Shard' >> beam.GroupByKey()
                | 'Search' >> beam.ParDo(SearchShard(), beam.pvalue.AsSingleton(seed_vecs))
                .with_outputs(SearchShard.INFO, main='matches'))
    (searched.matches
     | 'BySeed' >> beam.GroupByKey()
     | 'Merge' >> beam.MapTuple(
         lambda sid, ms: (sid, search_lib.merge_top([list(ms)], cfg.top_k)))
     | 'MatchList' >> beam.combiners.ToList()
     | 'WriteMatches' >> beam.Map(lambda ms: write_list(
         [[sid, list(m)] for sid, top in ms for m in top], 'matches.json')))
    (decoded.skipped | 'SkipList' >> beam.combiners.ToList()
     | 'WriteSkips' >> beam.Map(lambda s: write_list(s, 'skipped.json')))
    (searched.info | 'InfoList' >> beam.combiners.ToList()
     | 'WriteInfo' >> beam.Map(lambda s: write_list(s, 'shards.json')))
  seconds = time.perf_counter() - t0
  from apache_beam.io.filesystems import FileSystems  # pylint: disable=g-import-not-at-top
  staged = {name: files.join(staging, f'{run_tag}-{name}')
            for name in ('matches.json', 'skipped.json', 'shards.json')}
  matches, skipped, shards = (json.loads(files.read_bytes(staged[n])) for n in
                              ('matches.json', 'skipped.json', 'shards.json'))
  FileSystems.delete(list(staged.values()))
  return outputs.write(out, cfg=cfg, seeds=seeds, captions=captions, videos=videos,
                       matches=matches, skipped=skipped, shards=shards,
                       seconds=seconds, videos_dir=videos_dir, embedder=embedder_name)
