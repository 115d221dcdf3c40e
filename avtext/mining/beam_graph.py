"""The mining pipeline's Beam graph (`pipeline.build_and_run` runs it; its docstring
describes the stages): the DoFns and functions of each transform, at module level and
given the values they need when the graph is built, so that Beam pickles them by
reference into its worker processes (the direct runner's multi_processing mode, Dask).

This module imports apache_beam; only `pipeline.build_and_run` imports it, lazily.
"""
from __future__ import annotations

import json
import logging
from typing import Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from avtext.mining import beam_files
from avtext.mining import runners
from avtext.mining import search as search_lib
from avtext.mining import stages

# The workers' progress and skips (`python -m avtext.mine` keeps the avtext loggers at
# INFO in every worker while Beam's own loggers stay at WARNING).
_LOG = logging.getLogger(__name__)
_INT_ANY = beam.typehints.Tuple[int, beam.typehints.Any]  # GroupByKey keys are ints


class SeedShard(beam.DoFn):
  """(shard, start row, stop row, image paths | None) -> `stages.seed_shard`'s record of
  the shard file it writes under `staging`."""

  def __init__(self, staging: str, embedder_name: str, seed_features: str | None, cfg):
    super().__init__()
    self.staging, self.embedder_name = staging, embedder_name
    self.seed_features, self.cfg = seed_features, cfg

  def process(self, shard):
    j, start, stop, paths = shard
    yield stages.seed_shard(self.staging, j, start, stop, paths, self.embedder_name,
                            self.seed_features, self.cfg)


class DecodeEmbed(beam.DoFn):
  """(video id, path) -> ('video', its video shard, frame record) or ('skip', -1, skip
  record)."""

  def __init__(self, staging: str, embedder_name: str, cfg, num_video_shards: int):
    super().__init__()
    self.staging, self.embedder_name = staging, embedder_name
    self.cfg, self.num_video_shards = cfg, num_video_shards

  def setup(self):
    self.done = 0

  def process(self, item):
    video_id, path = item
    record, skip = stages.decode_and_embed(video_id, path, self.embedder_name, self.cfg)
    self.done += 1
    if self.done % 50 == 0:
      _LOG.info('mining: this worker decoded and embedded %d videos', self.done)
    stages.note_peak_rss(self.staging)
    if skip is not None:
      _LOG.warning('mining: skipped %s (%s: %s)', video_id, skip['reason'], skip['detail'])
      yield 'skip', -1, skip
      return
    yield 'video', stages.shard_of(video_id, self.num_video_shards), record


class FanOut(beam.DoFn):
  """A seed shard file, to every video shard."""

  def __init__(self, num_video_shards: int):
    super().__init__()
    self.num_video_shards = num_video_shards

  def process(self, seed_shard):
    for v in range(self.num_video_shards):
      yield v, ('seeds', seed_shard)


class Search(beam.DoFn):
  """(video shard, its frame records and every seed shard file) -> its matches and info."""

  def __init__(self, num_seeds: int, cfg, staging: str):
    super().__init__()
    self.num_seeds, self.cfg, self.staging = num_seeds, cfg, staging

  def process(self, element):
    video_shard, items = element
    items = list(items)
    records = [x for kind, x in items if kind == 'video']
    seed_files = [x for kind, x in items if kind == 'seeds']
    yield from stages.search_video_shard(video_shard, records, seed_files, self.num_seeds,
                                         self.cfg, self.staging)


class Merge(beam.DoFn):
  """(seed row, its matches from every video shard) -> (its seed shard, (row, global
  top_k))."""

  def __init__(self, cfg):
    super().__init__()
    self.cfg = cfg

  def process(self, element):
    row, matches = element
    yield row // self.cfg.shard_seeds, (row, search_lib.merge_top([list(matches)],
                                                                  self.cfg.top_k))


class WriteMatches(beam.DoFn):
  """(seed shard, its rows' merged matches) -> ('matches', matches-J.json's path)."""

  def __init__(self, staging: str):
    super().__init__()
    self.staging = staging

  def process(self, element):
    shard, tops = element
    yield 'matches', stages.write_matches(self.staging, shard, tops)


class Summary(beam.DoFn):
  """Every result -> summary.json under `staging` (yields its path)."""

  def __init__(self, staging: str):
    super().__init__()
    self.staging = staging

  def process(self, element):
    by_kind = {'skip': [], 'info': [], 'matches': []}
    for kind, x in element[1]:
      by_kind[kind].append(x)
    path = beam_files.join(self.staging, 'summary.json')
    beam_files.write_bytes(path, json.dumps(by_kind, sort_keys=True).encode())
    stages.note_peak_rss(self.staging)
    yield path


def run(staging: str, seed_shards: list[tuple], videos: Sequence[tuple[str, str]],
        num_seeds: int, embedder_name: str, cfg, beam_args: Sequence[str],
        seed_features: str | None) -> None:
  """Builds the graph over `seed_shards` ((shard, start, stop, image paths | None)) and
  `videos` and runs it (`runners.run`): summary.json under `staging` lists the results.

  One pipeline for every runner, within what Beam 2.77's DaskRunner executes: no side
  inputs (it recomputes their whole graph inside each task), no TaggedOutputs (it
  mixes them into the main output), no BatchElements or other output from
  finish_bundle (dropped), no metrics (not collected), and one sink (it computes only
  the last transform's bag): every branch ends in 'Summary'. Seed vectors go from the
  task that makes a shard to the searches through files, never through a shuffle,
  which would hold all of them in the workers' (Dask) or the runner's (FnApiRunner)
  memory at once."""
  num_video_shards = max(1, -(-len(videos) // cfg.shard_videos))
  p = beam.Pipeline(options=PipelineOptions(runners.partition_args(beam_args, len(videos))))
  seed_files = (p | 'SeedShards' >> beam.Create(seed_shards)
                | 'EmbedSeedShards' >> beam.ParDo(
                    SeedShard(staging, embedder_name, seed_features, cfg))
                | 'ToVideoShards' >> beam.ParDo(FanOut(num_video_shards)
                                               ).with_output_types(_INT_ANY))
  decoded = (p | 'Videos' >> beam.Create(videos)
             | 'Spread' >> beam.Reshuffle()
             | 'DecodeEmbed' >> beam.ParDo(
                 DecodeEmbed(staging, embedder_name, cfg, num_video_shards)))
  records = (decoded | 'Usable' >> beam.Filter(lambda x: x[0] == 'video')
             | 'KeyByVideoShard' >> beam.Map(
                 lambda x: (x[1], ('video', x[2]))).with_output_types(_INT_ANY))
  searched = ((records, seed_files) | 'ShardInputs' >> beam.Flatten()
              | 'ByVideoShard' >> beam.GroupByKey()
              | 'Search' >> beam.ParDo(Search(num_seeds, cfg, staging)))
  match_files = (searched | 'Matches' >> beam.Filter(lambda x: x[0] == 'match')
                 | 'KeyBySeed' >> beam.Map(lambda x: (x[1], x[2])).with_output_types(_INT_ANY)
                 | 'BySeed' >> beam.GroupByKey()
                 | 'Merge' >> beam.ParDo(Merge(cfg)).with_output_types(_INT_ANY)
                 | 'ByMergedSeedShard' >> beam.GroupByKey()
                 | 'WriteMatches' >> beam.ParDo(WriteMatches(staging)))
  skips = decoded | 'Skips' >> beam.Filter(lambda x: x[0] == 'skip') | 'SkipRecords' >> beam.Map(
      lambda x: ('skip', x[2]))
  infos = searched | 'Infos' >> beam.Filter(lambda x: x[0] == 'info')
  _ = ((match_files, skips, infos) | 'Results' >> beam.Flatten()
       | 'OneKey' >> beam.Map(lambda x: (0, x)).with_output_types(_INT_ANY)
       | 'AllResults' >> beam.GroupByKey()
       | 'Summary' >> beam.ParDo(Summary(staging)))
  runners.run(p)
