"""VideoCC mining (issues 12, 34): the synthetic mining world, video_io, the FAISS shard
search, and the Beam pipeline on the direct runner and on a local Dask cluster against a
brute-force loop."""
import dataclasses
import functools
import hashlib
import json
import pathlib

import numpy as np
import pytest

from avtext.data import video_io
from avtext.mining import beam_files
from avtext.mining import embed
from avtext.mining import outputs
from avtext.mining import pipeline
from avtext.mining import runners
from avtext.mining import search
from avtext.mining import stages
from avworld import captions
from avworld import mining
from avworld import mining_corpus
from avworld import world

SPEC = world.WorldSpec(height=32, width=32, fps=25, duration_s=10.0)
TINY = mining.MiningWorld(num_seeds=24, num_videos=9, seed_scene_rate=0.5,
                          num_scenes=(3, 4), scene_seconds=(4.0, 6.0), spec=SPEC)
FAULTS = ('truncated', 'empty', 'not_video', 'audio_only', 'short', 'no_audio')
HIST = 'callable:avtext.mining.embed:colour_histogram'


# ------------------------------------------------------------------ the world
def test_default_corpus_videos_are_at_least_a_minute_and_plant_seed_content():
  w = mining.MiningWorld(num_seeds=50, num_videos=20)
  planted = 0
  for i in range(w.num_videos):
    d = w.describe_video(i)
    assert d['duration_s'] >= 60.0
    for s in d['scenes']:
      if s['seed'] >= 0:
        planted += 1
        seed_attrs = w._seed(s['seed'])[0].attributes()  # pylint: disable=protected-access
        # A planted scene shows the seed's objects and background, so its caption fits.
        assert s['attributes']['objects'] == seed_attrs['objects']
        assert s['attributes']['background'] == seed_attrs['background']
        assert captions.caption_fits(w.seed_mention(s['seed']), s['attributes'])
  assert planted > 0
  # Seed captions never state the sound; seeds and videos are reproducible.
  assert all('sound' not in w.seed_mention(i) for i in range(w.num_seeds))
  w2 = mining.MiningWorld(num_seeds=50, num_videos=20)
  assert w2.describe_video(7) == w.describe_video(7)
  np.testing.assert_array_equal(w2.seed_image(3), w.seed_image(3))


def _seed_captions_digest(w):
  h = hashlib.sha256()
  for i in range(w.num_seeds):
    h.update(w.seed_caption(i).encode())
    h.update(json.dumps(w.seed_mention(i), sort_keys=True).encode())
  return h.hexdigest()


def test_seed_captions_state_what_a_still_shows_and_the_option_restores_motion():
  w = mining.MiningWorld(num_seeds=200, num_videos=1)
  old = dataclasses.replace(w, seed_caption_motion=True)
  stated_motion = 0
  for i in range(w.num_seeds):
    scene = w._seed(i)[0]  # pylint: disable=protected-access
    mention, text = w.seed_mention(i), w.seed_caption(i)
    assert all(set(d) <= {'shape', 'colour'} for d in mention['objects']), mention
    assert not any(field == 'motion' for field, _ in captions.parse_statements(text)), text
    assert captions.caption_fits(mention, scene.attributes())
    old_mention = old.seed_mention(i)
    assert captions.caption_fits(old_mention, scene.attributes())
    stated_motion += any('motion' in d for d in old_mention['objects'])
  assert stated_motion / w.num_seeds > 0.5  # 74 % of these 200
  # The option gives the captions of the world before it, exactly (recorded then); the
  # images and the corpus are the same either way.
  assert _seed_captions_digest(old) == (
      '23d7c1a5d06f55146a5dc1419dfb0040b0d28c3dc1e1203fbc05c19286494fe6')
  np.testing.assert_array_equal(w.seed_image(7), old.seed_image(7))
  assert w.describe_video(0) == old.describe_video(0)


def test_world_json_keeps_the_caption_option_and_reads_old_worlds_as_stating_motion():
  for w in (TINY, dataclasses.replace(TINY, seed_caption_motion=True)):
    meta = json.loads(json.dumps(mining_corpus.world_meta(w, FAULTS)))
    assert mining_corpus.world_from_meta(meta) == w
  old = json.loads(json.dumps(mining_corpus.world_meta(TINY, FAULTS)))
  del old['world']['seed_caption_motion']
  old['format'] = 'avtext.mining_world/1'  # written before the option
  assert mining_corpus.world_from_meta(old).seed_caption_motion


def test_clip_fits_is_some_overlapping_scene_fitting():
  w = TINY
  for v in range(3):
    d = w.describe_video(v)
    for s in range(w.num_seeds):
      for k, sc in enumerate(d['scenes']):
        mid = (sc['start_s'] + sc['stop_s']) / 2
        fits = captions.caption_fits(w.seed_mention(s), sc['attributes'])
        assert w.frame_fits(v, [mid], s)[0] == fits
        assert w.clip_fits(v, mid - 0.01, mid + 0.01, s) == fits


# ------------------------------------------------------------------ video_io
@pytest.fixture(scope='module')
def corpus(tmp_path_factory):
  root = tmp_path_factory.mktemp('mining')
  mining_corpus.write(root, TINY, FAULTS)
  return root


def test_decoded_frames_and_audio_match_the_world(corpus):
  path = corpus / 'videos' / f'{TINY.video_id(0)}.mp4'
  info = video_io.probe(path)
  assert info.has_audio and info.fps == 25 and (info.height, info.width) == (32, 32)
  assert abs(info.duration_s - TINY.video(0).duration_s) < 0.05
  times = video_io.sample_times(info.duration_s, 1.0)
  np.testing.assert_allclose(times[:3], [0.5, 1.5, 2.5])
  got = video_io.read_frames(path, times[::-1]).astype(np.int64)[::-1]
  shown = np.floor(times * 25 + 1e-6) / 25  # the frame on screen at each time
  ref = TINY.render_frames(0, shown).astype(np.int64)
  assert np.abs(got - ref).mean() < 4.0  # H.264 at crf 18, 4:2:0 chroma
  # The decoded frame is the one on screen, not a neighbour a few frames away.
  for j in range(0, len(times), 3):
    errs = [np.abs(got[j] - TINY.render_frames(0, [shown[j] + dt])[0]).mean()
            for dt in (-0.2, 0.0, 0.2)]
    assert errs[1] <= min(errs) + 1e-9
  wave = video_io.read_audio(path, 2.0, 1.5)
  ref = TINY.render_audio(0, 32000, 24000)
  assert len(wave) == 24000 and np.corrcoef(wave, ref)[0, 1] > 0.95


@pytest.mark.parametrize('fault,reason', [('truncated', 'truncated'), ('empty', 'empty'),
                                          ('not_video', 'unreadable'),
                                          ('audio_only', 'no_video')])
def test_bad_files_raise_naming_file_and_reason(corpus, fault, reason):
  index = TINY.num_videos - len(FAULTS) + FAULTS.index(fault)
  path = corpus / 'videos' / f'{TINY.video_id(index)}.mp4'
  with pytest.raises(video_io.VideoReadError) as e:
    info = video_io.probe(path)
    video_io.read_frames(path, video_io.sample_times(info.duration_s))
  assert e.value.reason == reason and str(path) in str(e.value)
  with pytest.raises(video_io.VideoReadError, match='missing'):
    video_io.probe(corpus / 'nope.mp4')


def test_no_audio_and_short_files_read(corpus):
  base = TINY.num_videos - len(FAULTS)
  no_audio = corpus / 'videos' / f'{TINY.video_id(base + FAULTS.index("no_audio"))}.mp4'
  assert not video_io.probe(no_audio).has_audio and video_io.read_audio(no_audio) is None
  short = corpus / 'videos' / f'{TINY.video_id(base + FAULTS.index("short"))}.mp4'
  assert abs(video_io.probe(short).duration_s - 6.0) < 0.05


# ------------------------------------------------------------------ clips and search
def test_clip_bounds_clamp_at_video_ends():
  assert outputs.clip_bounds(30.0, 60.0, 10.0) == (25.0, 35.0)
  assert outputs.clip_bounds(2.0, 60.0, 10.0) == (0.0, 10.0)  # shifted right
  assert outputs.clip_bounds(58.5, 60.0, 10.0) == (50.0, 60.0)  # shifted left
  assert outputs.clip_bounds(5.0, 10.0, 10.0) == (0.0, 10.0)  # exactly t long
  with pytest.raises(ValueError, match='shorter than the clip'):
    outputs.clip_bounds(3.0, 8.0, 10.0)


def _brute(seeds, frames, frame_video, tau, top_k):
  """The literal loop: every (seed, video) pair's best frame, kept if >= tau; similarity
  as the search defines it (float32 vectors, products summed in float64, then float32)."""
  out = []
  for q in seeds:
    best = []
    for v in np.unique(frame_video):
      rows = np.flatnonzero(frame_video == v)
      s = (frames[rows].astype(np.float64) @ q.astype(np.float64)).astype(np.float32)
      j = int(np.argmax(s))
      if s[j] >= tau:
        best.append((float(s[j]), int(v), int(rows[j])))
    best.sort(key=lambda t: (-t[0], t[1], t[2]))
    out.append(best[:top_k])
  return out


def test_shard_search_exact_equals_brute_force_and_widens():
  rng = np.random.default_rng(0)
  # 40 videos of 30-80 near-duplicate frames: the first k frames found are mostly
  # one video, so the search must widen to find 10 distinct videos.
  centres = embed.l2_normalize(rng.normal(size=(40, 16)))
  counts = rng.integers(30, 80, size=40)
  frame_video = np.repeat(np.arange(40), counts)
  frames = embed.l2_normalize(centres[frame_video] + 0.05 * rng.normal(size=(len(frame_video), 16)))
  seeds = embed.l2_normalize(centres[:12] + 0.3 * rng.normal(size=(12, 16)))
  got, info = search.search_shard(seeds, frames, frame_video, tau=-1.0, top_k=10)
  assert info['index'] == 'flat'
  want = _brute(seeds, frames, frame_video, -1.0, 10)
  for g, w in zip(got, want):
    assert [(m.video, m.frame) for m in g] == [(v, f) for _, v, f in w]
    np.testing.assert_allclose([m.sim for m in g], [s for s, _, _ in w], rtol=0, atol=1e-6)
  got, _ = search.search_shard(seeds, frames, frame_video, tau=0.5, top_k=10)
  want = _brute(seeds, frames, frame_video, 0.5, 10)
  assert [[(m.video, m.frame) for m in g] for g in got] == \
      [[(v, f) for _, v, f in w] for w in want]
  # HNSW / IVF past exact_max_frames: the same kind of answer, most of it found.
  want = _brute(seeds, frames, frame_video, -1.0, 10)
  for kind in ('hnsw', 'ivf'):
    cfg = search.IndexConfig(exact_max_frames=100, approx=kind, ivf_nprobe=64)
    approx, info = search.search_shard(seeds, frames, frame_video, tau=-1.0, top_k=10,
                                       index_cfg=cfg)
    assert info['index'].startswith(kind)
    hits = sum(len({(m.video, m.frame) for m in a} & {(v, f) for _, v, f in w})
               for a, w in zip(approx, want))
    assert hits / sum(len(w) for w in want) > 0.8, kind


# ------------------------------------------------------------------ the pipeline
@pytest.fixture(scope='module')
def mined(corpus, tmp_path_factory):
  out = tmp_path_factory.mktemp('mined')
  cfg = pipeline.MiningConfig(tau=0.7, tau_grid=(0.6, 0.7, 0.8), shard_videos=2,
                              shard_seeds=10, embed_batch=16)
  info = pipeline.build_and_run(
      str(corpus / 'seeds' / 'seeds.tsv'), str(corpus / 'videos'), HIST, str(out), cfg,
      ['--runner=FnApiRunner', '--direct_num_workers=2',
       '--direct_running_mode=multi_processing'])
  return out, cfg, info


@functools.lru_cache(maxsize=2)
def _colour_histograms(corpus, clip_seconds):
  """The colour-histogram f of the seed images and of every readable video's frames."""
  seeds = beam_files.read_seeds(corpus / 'seeds' / 'seeds.tsv')
  f = embed.colour_histogram
  seed_vecs = f(np.stack([beam_files.load_image(p, None) for _, p, _ in seeds]))
  vecs, owner, times, videos = [], [], [], []
  for vid, path in beam_files.list_videos(corpus / 'videos'):
    try:
      info = video_io.probe(path)
      if info.duration_s < clip_seconds:
        continue
      t = video_io.sample_times(info.duration_s, 1.0)
      x = f(video_io.read_frames(path, t))
    except video_io.VideoReadError:
      continue
    vecs.append(x), owner.append(np.full(len(t), len(videos))), times.append(t)
    videos.append((vid, info.duration_s))
  return (seeds, seed_vecs, np.concatenate(vecs), np.concatenate(owner), np.concatenate(times),
          videos)


def _brute_force_csv(corpus, cfg, centre=False):
  """videocc.csv's rows by the literal loop over the colour-histogram f; with centre, every
  seed and frame vector minus the mean seed vector (float64 mean), renormalized."""
  seeds, seed_vecs, vecs, owner, times, videos = _colour_histograms(corpus, cfg.clip_seconds)
  if centre:
    mean = seed_vecs.astype(np.float64).mean(0)
    seed_vecs = embed.l2_normalize(seed_vecs - mean)
    vecs = embed.l2_normalize(vecs - mean)
  want = []
  for (sid, _, caption), best in zip(seeds, _brute(seed_vecs, vecs, owner, cfg.tau, 10)):
    for _, v, frame in best:
      vid, duration = videos[v]
      start = min(max(times[frame] - 5.0, 0.0), duration - 10.0)
      want.append([vid, str(int(round(start * 1e6))), str(int(round((start + 10) * 1e6))),
                   caption])
  return sorted(want)


def _csv_rows(out):
  import csv  # pylint: disable=g-import-not-at-top
  return sorted(csv.reader((out / 'videocc.csv').read_text().splitlines()))


def test_direct_runner_2_workers_gives_the_brute_force_clips(corpus, mined):
  out, cfg, _ = mined
  want = _brute_force_csv(corpus, cfg)
  assert len(want) > 20
  assert _csv_rows(out) == want


def test_seed_mean_centring_gives_the_brute_force_clips(corpus, tmp_path):
  """--center=seed_mean: the mean of the seed shards' sums (5 shards here) centres seeds
  and frames in every video shard, as the loop does with one float64 mean."""
  cfg = pipeline.MiningConfig(tau=0.5, tau_grid=(0.5,), shard_videos=3, shard_seeds=5,
                              embed_batch=16, center='seed_mean')
  pipeline.build_and_run(str(corpus / 'seeds' / 'seeds.tsv'), str(corpus / 'videos'), HIST,
                         str(tmp_path), cfg, ['--runner=FnApiRunner'])
  want = _brute_force_csv(corpus, cfg, centre=True)
  assert len(want) > 20
  assert _csv_rows(tmp_path) == want
  assert want != _brute_force_csv(corpus, cfg)  # centring changed the matches
  stats = json.loads((tmp_path / 'stats.json').read_text())
  assert stats['config']['center'] == 'seed_mean'
  with pytest.raises(ValueError, match='--center must be one of'):
    pipeline.MiningConfig(center='corpus')


def test_a_worker_reports_its_own_peak_memory_not_its_parents():
  """A worker process started (fork + exec) by a large driver reports its own peak: Linux
  carries getrusage's ru_maxrss across exec, which once had a 100 MiB Dask worker report
  the 5.6 GiB of the pytest process that started it."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  big = np.ones(2**27)  # 1 GiB, touched: this process' peak is at least that
  assert stages.peak_rss_mb() > 1024
  code = 'from avtext.mining import stages; print(stages.peak_rss_mb())'
  child = float(subprocess.run([sys.executable, '-c', code], check=True, capture_output=True,
                               text=True).stdout)
  del big
  assert 5 < child < 200  # the interpreter, numpy and the module; nothing of the parent's


def test_cosine_histogram_and_its_quantiles():
  frames = np.float32([[1, 0], [0, 1], [-1, 0], [0.6, 0.8]])
  hist = search.cosine_histogram(np.float32([[1, 0]]), frames)  # cosines 1, 0, -1, 0.6
  assert hist.sum() == 4 and hist[[0, 1000, 1600, 1999]].tolist() == [1, 1, 1, 1]
  assert search.cosine_quantile(hist, 0.25) == -0.999  # bin [-1, -0.999)
  assert search.cosine_quantile(hist, 0.5) == 0.001
  assert search.cosine_quantile(hist, 0.75) == 0.601
  assert search.cosine_quantile(hist, 1.0) == 1.0
  assert outputs.random_pairs([{'cosine_hist': hist}, {'cosine_hist': hist}, {}]) == {
      'pairs': 8, 'cosine_quantiles': {'50': 0.001, '90': 1.0, '99': 1.0, '99.9': 1.0,
                                       '99.99': 1.0}}


def test_centring_by_an_exact_fixed_point_mean():
  x = np.array([[0.1, -0.25], [0.3, 0.5]], np.float32)
  # rint(v * 2^24): 0.1 -> 1677722 (0.1f * 2^24 = 1677721.625), -0.25 -> -4194304,
  # 0.3 -> 5033165 (0.3f = 0.300000011920928955078125), 0.5 -> 8388608.
  np.testing.assert_array_equal(embed.fixed_point_sum(x), [1677722 + 5033165, -4194304 + 8388608])
  np.testing.assert_array_equal(embed.mean_from_sums(embed.fixed_point_sum(x), 2),
                                np.float32([6710887 / 2**25, 4194304 / 2**25]))
  # Integer sums: any split of the rows into shards gives the same sum.
  rng = np.random.default_rng(0)
  y = embed.l2_normalize(rng.normal(size=(101, 8)))
  parts = sum(embed.fixed_point_sum(y[a:a + 17]) for a in range(0, 101, 17))
  np.testing.assert_array_equal(parts, embed.fixed_point_sum(y[::-1]))
  np.testing.assert_allclose(embed.mean_from_sums(parts, 101), y.mean(0), atol=1e-7)
  # (1, 0) and (0, 1) minus their mean (0.5, 0.5) point away from each other: cosine -1.
  c = embed.centre(np.eye(2, dtype=np.float32), np.float32([0.5, 0.5]))
  np.testing.assert_allclose(c, np.array([[1, -1], [-1, 1]]) / np.sqrt(2), rtol=1e-6)
  np.testing.assert_array_equal(embed.centre(x, None), x)
  with pytest.raises(ValueError, match='mean of shape'):
    embed.centre(x, np.zeros(3))
  with pytest.raises(ValueError, match='no rows'):
    embed.mean_from_sums(np.zeros(2, np.int64), 0)


def test_bad_videos_are_counted_not_fatal(mined):
  out, _, _ = mined
  stats = json.loads((out / 'stats.json').read_text())
  assert stats['skipped'] == {'empty': 1, 'no_video': 1, 'short': 1, 'truncated': 1,
                              'unreadable': 1}
  assert stats['videos_searched'] == TINY.num_videos - 5
  skipped = [json.loads(l) for l in (out / 'skipped.jsonl').read_text().splitlines()]
  assert {s['video_id'] for s in skipped} == {
      TINY.video_id(TINY.num_videos - len(FAULTS) + k) for k in range(5)}
  # The video without audio is searched and its clips flagged.
  rows = [json.loads(l) for l in (out / 'matches.jsonl').read_text().splitlines()]
  no_audio = TINY.video_id(TINY.num_videos - 1)
  assert all(r['has_audio'] == (r['video_id'] != no_audio) for r in rows)


def test_stats_precision_and_rerun_gives_the_same_files(corpus, mined, tmp_path):
  out, cfg, _ = mined
  stats = json.loads((out / 'stats.json').read_text())
  per = {p['tau']: p for p in stats['per_tau']}
  assert per[0.6]['matches'] >= per[0.7]['matches'] >= per[0.8]['matches']
  rows = [json.loads(l) for l in (out / 'matches.jsonl').read_text().splitlines()]
  truth, _ = __import__('avtext.mining.outputs', fromlist=['x']).corpus_truth(
      corpus / 'videos')
  kept = [r for r in rows if r['sim'] >= 0.7]
  assert per[0.7]['precision'] == pytest.approx(np.mean([truth(r) for r in kept]))
  for name in ('matches_vs_tau.png', 'clips_per_caption.png'):
    assert (out / 'plots' / name).stat().st_size > 1000
  # A second run, in one process this time: the same files, byte for byte.
  pipeline.build_and_run(str(corpus / 'seeds' / 'seeds.tsv'), str(corpus / 'videos'), HIST,
                         str(tmp_path), cfg, ['--runner=FnApiRunner'])
  for name in OUTPUT_FILES:
    assert (tmp_path / name).read_bytes() == (out / name).read_bytes(), name


@pytest.fixture(scope='module')
def brute_force_outputs(corpus, mined, tmp_path_factory):
  """The output files of a plain loop over the same embedded frames: every video decoded
  and embedded in turn (`stages.decode_and_embed`), every (seed, video) pair's best frame
  by exhaustive numpy search, each seed's top_k >= the lowest τ, no shards, no Beam."""
  _, cfg, _ = mined
  seeds = beam_files.read_seeds(corpus / 'seeds' / 'seeds.tsv')
  videos = beam_files.list_videos(corpus / 'videos')
  f = embed.resolve(HIST)
  seed_vecs = f(np.stack([beam_files.load_image(p, None) for _, p, _ in seeds]))
  records, skipped = [], []
  for vid, path in videos:
    record, skip = stages.decode_and_embed(vid, path, HIST, cfg)
    (records if record is not None else skipped).append(record or skip)
  vecs = np.concatenate([r['vecs'] for r in records])
  owner = np.concatenate([np.full(len(r['times']), k) for k, r in enumerate(records)])
  matches = []
  hist = np.zeros(2000, np.int64)  # every seed is in the recall sample of the tiny world
  for (sid, _, _), q in zip(seeds, seed_vecs):
    best = []
    for k, r in enumerate(records):
      s = (vecs[owner == k].astype(np.float64) @ q.astype(np.float64)).astype(np.float32)
      for x in s:
        hist[min(int(np.floor((float(x) + 1) * 1000)), 1999)] += 1
      j = int(np.argmax(s))
      if s[j] >= cfg.search_tau:
        best.append([float(s[j]), r['video_id'], float(r['times'][j]), r['duration_s'],
                     r['has_audio'], r['path']])
    best.sort(key=lambda m: (-m[0], m[1]))
    matches += [[sid, m] for m in best[:cfg.top_k]]
  out = tmp_path_factory.mktemp('brute')
  outputs.write(out, cfg=cfg, seeds=seeds, captions={s: c for s, _, c in seeds},
                videos=videos, matches=matches, skipped=skipped, seconds=0.0,
                shards=[{'frames': len(vecs), 'seconds': 0.0, 'cosine_hist': hist.tolist()}],
                videos_dir=str(corpus / 'videos'), embedder=HIST)
  return out


OUTPUT_FILES = ('videocc.csv', 'matches.jsonl', 'skipped.jsonl', 'stats.json', 'dataset.json',
                'plots/matches_vs_tau.png', 'plots/clips_per_caption.png')


@pytest.mark.slow  # `make test-slow` (CI runs it): the default run's 12-minute budget
def test_dask_local_cluster_direct_runner_and_brute_force_write_the_same_bytes(
    corpus, mined, brute_force_outputs, tmp_path):
  """Acceptance 1 of issue 34: 3 seed shards x 5 video shards on 2 Dask worker processes."""
  out, cfg, _ = mined
  with runners.beam_args_for(['--runner=DaskRunner'], dask_local_workers=2) as args:
    info = pipeline.build_and_run(str(corpus / 'seeds' / 'seeds.tsv'), str(corpus / 'videos'),
                                  HIST, str(tmp_path), cfg, args)
  assert len((out / 'videocc.csv').read_text().splitlines()) > 20
  for name in OUTPUT_FILES:
    assert (tmp_path / name).read_bytes() == (out / name).read_bytes(), name
    assert (brute_force_outputs / name).read_bytes() == (out / name).read_bytes(), name
  # Both worker processes reported their peak memory, apart from the driver's.
  import os  # pylint: disable=g-import-not-at-top
  names = sorted(w['worker'] for w in info['workers'])
  assert len(names) == 3 and names[0] == 'driver' and not any(
      n.endswith(f'-{os.getpid()}') for n in names)
  assert 50 < info['peak_worker_rss_mb'] < 4000
  assert not (tmp_path / '_beam').exists()  # staging files and their directory are removed


def test_runner_flags_fail_clearly():
  with pytest.raises(ValueError, match='exactly one of --dask_address'):
    with runners.beam_args_for(['--runner=DaskRunner']):
      pass
  with pytest.raises(ValueError, match='need --runner=DaskRunner'):
    with runners.beam_args_for([], dask_local_workers=2):
      pass
  with pytest.raises(ValueError, match='--dask_address tcp://127.0.0.1:9: no Dask scheduler'):
    runners.connect('tcp://127.0.0.1:9', timeout_s=1)


def test_embedder_always_sees_embed_batch_rows_and_seed_features_read_by_rows(tmp_path):
  shapes = []

  def f(x):
    shapes.append(x.shape)
    return x.reshape(len(x), -1).astype(np.float32) * 2

  x = np.arange(37 * 2 * 2 * 3).reshape(37, 2, 2, 3)
  got = stages.embed_fixed(f, x, 16)
  assert shapes == [(16, 2, 2, 3)] * 3
  np.testing.assert_array_equal(got, x.reshape(37, -1) * 2)
  np.save(tmp_path / 'feat.npy', x.reshape(37, -1).astype(np.float32))
  np.testing.assert_array_equal(stages.read_npy_rows(str(tmp_path / 'feat.npy'), 5, 9),
                                x.reshape(37, -1)[5:9])
  assert pipeline.seed_shards(37, pipeline.MiningConfig(shard_seeds=20)) == \
      [(0, 0, 20), (1, 20, 37)]


def test_mining_does_not_import_the_trainer_or_tasks():
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  code = ('import sys, avtext.mining.pipeline, avtext.mining.embed, avtext.mining.outputs, '
          'avworld.mining_corpus, avtext.mining.search; '
          'print(sorted(m for m in sys.modules if m.startswith(("avtext.train", "avtext.tasks"))))')
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == '[]'


def test_mined_dataset_reads_the_clips_by_decoding_or_rendering(mined):
  import ml_collections  # pylint: disable=g-import-not-at-top
  out, cfg, _ = mined
  lines = (out / 'videocc.csv').read_text().splitlines()
  ds = ml_collections.ConfigDict(dict(name='videocc_mined', path=str(out), decode='files'))
  from avtext.data.builders import mined as mined_lib  # pylint: disable=g-import-not-at-top
  files = mined_lib.MinedClips(out, decode='files')
  render = mined_lib.MinedClips(out, decode='auto')
  assert render.render and not files.render and len(files) == len(lines) == len(render)
  no_audio = TINY.video_id(TINY.num_videos - 1)
  for i in range(0, len(files), max(1, len(files) // 6)):
    d = files.describe(i)
    vid, start_us, end_us, caption = next(__import__('csv').reader([lines[i]]))
    assert (d['video_id'], d['caption']) == (vid, caption)
    assert d['has_audio'] == (vid != no_audio) and d['num_frames'] == 250
    idx = np.array([0, 7, 100, 249])
    a, b = files.render_frames(i, idx).astype(int), render.render_frames(i, idx).astype(int)
    # H.264 at crf 18 on 32x32 frames: up to ~6 levels a frame (mean over a frame's
    # pixels; the world's first 3 videos, with or without mbtree: p99 5.8, max 5.9).
    assert np.abs(a - b).mean() < 6.0
    if d['has_audio']:
      wa, wb = files.render_audio(i, 8000, 16000), render.render_audio(i, 8000, 16000)
      assert len(wa) == len(wb) == 16000 and np.corrcoef(wa, wb)[0, 1] > 0.95
  with pytest.raises(ValueError, match='only a train split'):
    mined_lib.videocc_mined(ds, 'test')
  with pytest.raises(FileNotFoundError, match='dataset.json'):
    mined_lib.MinedClips(out / 'plots')


@pytest.mark.slow  # an end-to-end training run (~28 s); `make demo-mining` runs it at demo size
def test_avr_trains_on_the_mined_dataset_and_tests_on_the_world(mined, tmp_path):
  """configs/videocc_avr.py:tiny,mined reads the mining output directly (the one trainer)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  from avtext import experiment  # pylint: disable=g-import-not-at-top
  out, _, _ = mined
  spec = importlib.util.spec_from_file_location(
      'videocc_avr', pathlib.Path(__file__).parent.parent / 'configs' / 'videocc_avr.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config('tiny,mined')
  config.dataset.path = str(out)
  config.train.num_steps = 4
  trainer = experiment.build(config, tmp_path / 'run')
  trainer.train()
  results = json.loads((tmp_path / 'run' / 'results.json').read_text())['latest']
  # Trained on the mined pairs; tested on the synthetic test split (16 clips, tiny).
  assert results['step'] == 4 and results['test/num_videos'] == 16
  assert results['test/chance_r1'] == pytest.approx(100 / 16)
