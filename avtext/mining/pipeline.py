r"""VideoCC mining (§3.1) as an Apache Beam pipeline: image captions -> video clips.

    python -m avtext.mine --seeds=SEEDS.tsv --videos=DIR --workdir=RUN_DIR \
        --out=OUT [--tau=0.6 --top_k=10 --clip_seconds=10 --shard_seeds=100000] \
        [--center=none|seed_mean] \
        [--runner=DaskRunner --dask_local_workers=N | --dask_address=HOST:PORT] \
        [Beam options]

Inputs
  seeds.tsv   one seed image per line: `seed_id <TAB> image path <TAB> caption` (the
              path relative to the file's directory; PNG/JPEG). CC3M users write it
              from the release TSV (caption, url) and the images they downloaded.
  videos      a directory; every file with a video extension (beam_files.VIDEO_EXTENSIONS) under
              it, recursively, is a corpus video whose id is its path relative to the
              directory without the extension.

Stages (each a Beam transform of `avtext.mining.beam_graph`; `avtext.mining.stages`
holds the work of each)
  1. seed features f(x_seed): each seed shard (`shard_seeds` rows of seeds.tsv) is one
     task: its images through the embedder (`avtext.mining.embed`) `embed_batch` at a
     time, or its rows of `--seed_features` (a [num_seeds, D] .npy computed elsewhere),
     written to a file under OUT/_beam/RUN; seed vectors never pass through a shuffle.
  2. frames at `frames_hz` (1 fps) of each video -> f(x_v); a video that cannot be read
     (`video_io.REASONS`), or is shorter than the clip length t ('short'), is a
     counted, logged skip; a video without audio is counted ('no_audio') and kept,
     flagged, as VideoCC's AVR pads missing audio with zeros (app. C).
  3. videos are hashed into shards of ~`shard_videos`; each video shard builds one FAISS
     index over its frames and searches it with every seed shard in turn, one seed
     shard file in memory at a time, for every seed's top_k matches >= tau there
     (`avtext.mining.search`); the (seed shard x video shard) lists are merged per seed
     into the global top_k (exact, as shards hold whole videos). Approximate shards also
     search `recall_sample` seeds exactly and report the approximate index's recall.
     With `center='seed_mean'` (not the paper's; the paper's f is used as it is) each
     search first subtracts the mean seed vector from its seeds and frames and
     renormalizes them (`embed.centre`). The mean comes from the seed shards' exact
     fixed-point sums, which travel with the shard files, so every video shard uses the
     same bits without an extra pass or a side input; it depends on the seeds alone, so
     a corpus mined in several runs (more videos later) keeps one f and one τ scale.
  4. each match becomes a clip of t = `clip_seconds` centred on the matched frame,
     shifted to stay inside the video, and takes the seed's caption.

Which side fans out. The work is the cross product seed shards x video shards. At CC3M
scale the seeds are S = 1.25M x 256 float32 = 1.3 GB and the frames F = 150M videos x
~10 frames x 1 KB = 1.5 TB. Whichever side moves is read once per shard of the side
that stays: moving the seeds costs S x F / (video shard bytes), moving the frames
F x S / (seed shard bytes), so the two are equal for equal shard bytes and the choice
falls to what else each costs. The frames stay: (a) they are grouped into video shards
once anyway, where they are decoded (one shuffle of F); moving them would add one more
copy of F per seed shard (10 x 1.5 TB at 100k seeds a shard), while moving the seeds
reads 1.3 GB per video shard, 1.9 TB in all at 1M-frame (~1 GB) video shards, 13 TB at
200k-frame ones; (b) the FAISS index is built over the stationary side, once per video
shard, and an HNSW / IVF build (13 s / 8 s at 200k frames here) is amortized over all
1.25M queries instead of being redone per seed shard; (c) top_k per seed is a
query-side question, so the seeds must be the queries. So the seed shards fan out, as
files (Beam's DaskRunner has no usable side inputs, and a side input of all seeds is
what a worker must not hold): a worker holds one video shard, its index and one seed
shard (`shard_seeds` x D x 4 bytes, 100 MB at the default 100k x 256), whatever the
number of seeds, and each video shard's search emits at most top_k matches per seed.
On a cluster, make `shard_videos` as large as a worker's memory allows (fewer reads of
the seeds) and `shard_seeds` small enough to sit beside it.

The search runs at the lowest threshold of `tau_grid` and `tau`, so the statistics
for every τ of Fig. 5 come from one run (top_k of the matches >= τ is the matches >=
τ among the top_k at a lower threshold); the CSV and the dataset hold the clips at τ.

Outputs (`outputs.write`): videocc.csv (VideoCC's public layout, no header: video id,
start µs, end µs, caption), matches.jsonl (every match at the lowest threshold:
seed, caption, video, path, similarity, frame time, clip, has_audio), skipped.jsonl,
dataset.json (what `dataset.name="videocc_mined"` reads), stats.json (+ Fig. 5 / Fig. 8
plots as PNG under plots/) and run.json (timings, index kinds, recall; the only file
that differs between two runs of the same command).

Runners (`avtext.mining.runners`; docs/mining.md has the cluster recipes): the default
is Beam's direct runner with `--direct_num_workers=2
--direct_running_mode=multi_processing`, named `--runner=FnApiRunner`: that is the engine
`--runner=DirectRunner` runs, after first trying Prism, a binary it would download from
GitHub at run time (nothing is fetched here; DirectRunner still works, logging the failed
download). `--runner=DaskRunner` runs the same pipeline on a `dask.distributed` cluster:
`--dask_address=HOST:PORT` (an existing one) or `--dask_local_workers=N` (a local one
of N processes, started for the run). Both are exercised here: the tests mine the tiny
corpus on the direct runner and on a 2-process local Dask cluster and get the same files,
byte for byte, as a brute-force loop; `benchmarks/speed/mining_dask_scale.py` measures both up
to 10k videos and 1M seeds. The pipeline keeps to what Beam 2.77's DaskRunner executes
(see `beam_graph.run`). Any other Beam runner takes the standard options, e.g. Dataflow
(the embedder's run directory and the inputs must then be on GCS and avtext installed
on the workers, e.g. --setup_file=./setup.py):

    python -m avtext.mine --seeds=gs://B/cc3m/seeds.tsv --videos=gs://B/videos \
        --workdir=gs://B/runs/tower --out=gs://B/videocc \
        --runner=DataflowRunner --project=P --region=us-central1 \
        --temp_location=gs://B/tmp --setup_file=./setup.py --num_workers=64
    (Flink / Spark: --runner=FlinkRunner --flink_master=HOST:8081, --runner=SparkRunner)

Dataflow, Flink and Spark are documented, not run here. Every path may be local or
remote (gs://, s3://, ...: Beam's FileSystems): seeds.tsv, the images, the video listing,
the workers' hand-over files under OUT/_beam; a remote video is copied to the worker's
disk before PyAV decodes it. On a cluster OUT must be storage every worker reaches.

Determinism: the files (all but run.json) are the same bytes on every runner, worker
count and sharding of one machine: batches of the embedder have one shape
(`stages.embed_fixed`), similarities are summed in float64 (`search.similarity`),
FAISS only proposes candidates (`search.MARGIN`), every sort key is total. Another CPU
can round f itself differently (BENCHMARKS.md "Determinism of the mined set").
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from typing import Sequence

from avtext.mining import beam_files
from avtext.mining import search as search_lib
from avtext.mining import stages


@dataclasses.dataclass(frozen=True)
class MiningConfig:
  tau: float = 0.6  # §3.2.1: the chosen match threshold
  top_k: int = 10  # §3.1: top 10 matches per seed
  clip_seconds: float = 10.0  # §3.2.1: t = 10 s
  frames_hz: float = 1.0  # §3.1: frames at 1 fps
  one_per_video: bool = True  # see avtext.mining.search
  tau_grid: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8, 0.9)  # Fig. 5
  shard_videos: int = 256
  shard_seeds: int = 100_000  # seeds a worker holds at once (module docstring)
  index: search_lib.IndexConfig = search_lib.IndexConfig()
  recall_sample: int = 256
  embed_batch: int = 128
  image_size: tuple[int, int] | None = None  # (H, W) frames and seed images are resized to
  # 'none': f as it is, the paper's cosine. 'seed_mean': every seed and frame vector minus
  # the mean of the seeds' unit vectors, renormalized (`embed.centre`), so that a cosine
  # measures what two images share beyond what every image of the seed set shares.
  center: str = 'none'

  CENTERS = ('none', 'seed_mean')

  @property
  def search_tau(self) -> float:
    return min((self.tau,) + tuple(self.tau_grid))

  def __post_init__(self):
    for name in ('top_k', 'shard_videos', 'shard_seeds', 'embed_batch'):
      if getattr(self, name) < 1:
        raise ValueError(f'--{name} must be >= 1, got {getattr(self, name)}')
    if self.center not in self.CENTERS:
      raise ValueError(f'--center must be one of {self.CENTERS}, got {self.center!r}')


def seed_shards(num_seeds: int, cfg: MiningConfig) -> list[tuple[int, int, int]]:
  """(shard, start row, stop row) of each seed shard: `shard_seeds` rows, the last fewer."""
  return [(j, a, min(num_seeds, a + cfg.shard_seeds))
          for j, a in enumerate(range(0, num_seeds, cfg.shard_seeds))]


# ------------------------------------------------------------------ the Beam pipeline
def build_and_run(seeds_tsv: str, videos_dir: str, embedder_name: str, out: str,
                  cfg: MiningConfig, beam_args: Sequence[str] = (), *,
                  seed_features: str | None = None, seeds: list | None = None,
                  videos: list | None = None) -> dict:
  """Run the pipeline (`beam_graph.run`); write the outputs (`outputs.write`); return
  run info. `seeds` and `videos`: `beam_files.read_seeds` and `beam_files.list_videos` of the
  first two, when the caller has read them already."""
  from avtext.mining import beam_graph  # pylint: disable=g-import-not-at-top
  from avtext.mining import outputs  # pylint: disable=g-import-not-at-top

  seeds = beam_files.read_seeds(seeds_tsv) if seeds is None else seeds
  videos = beam_files.list_videos(videos_dir) if videos is None else videos
  if not videos:
    raise ValueError(f'--videos {videos_dir}: no files with extensions '
                     f'{beam_files.VIDEO_EXTENSIONS}')
  if seed_features:
    shape, _, _ = stages.npy_header(seed_features)
    if shape[0] != len(seeds):
      raise ValueError(f'--seed_features {seed_features}: {shape[0]} rows for the '
                       f'{len(seeds)} seeds of {seeds_tsv}')
  # Workers hand seed shards and results over through files under OUT/_beam/RUN (Beam's
  # FileSystems: a local path on one machine, shared or gs:// storage on a cluster).
  run_tag = hashlib.sha1(f'{time.time_ns()}'.encode()).hexdigest()[:8]
  staging = beam_files.join(beam_files.join(str(out), '_beam'), run_tag)
  shards = [(j, a, b, None if seed_features else [seeds[r][1] for r in range(a, b)])
            for j, a, b in seed_shards(len(seeds), cfg)]
  t0 = time.perf_counter()
  try:
    beam_graph.run(staging, shards, videos, len(seeds), embedder_name, cfg, beam_args,
                   seed_features)
  except BaseException:  # failed or interrupted: the hand-over files go, OUT is as it was
    beam_files.delete_tree(staging, missing_ok=True)
    raise
  seconds = time.perf_counter() - t0

  done = json.loads(beam_files.read_bytes(beam_files.join(staging, 'summary.json')))
  matches = []
  for path in sorted(done['matches']):
    for row, top in json.loads(beam_files.read_bytes(path)):
      matches += [[seeds[row][0], m] for m in top]
  workers = [json.loads(beam_files.read_bytes(w))
             for w in beam_files.match(beam_files.join(staging, 'workers/*'))]
  seed_skips = [{'seed_id': seeds[s.pop('seed_row')][0], **s}
                for s in stages.seed_skips(staging)]
  beam_files.delete_tree(staging)
  workers.append({'worker': 'driver', 'peak_rss_mb': stages.peak_rss_mb()})
  return outputs.write(out, cfg=cfg, seeds=seeds, captions={sid: cap for sid, _, cap in seeds},
                       videos=videos, matches=matches, skipped=done['skip'],
                       seed_skips=seed_skips, shards=done['info'], seconds=seconds,
                       videos_dir=videos_dir, embedder=embedder_name, workers=workers)
