"""Your own videos: `avtext.index` over a folder of mp4s, `avtext.search_videos`, `avtext.caption`.

The folder: the mp4s `layouts` writes for the first 16 clips of the tiny world's train
split (half of them in a subfolder), a file that is not a video (skipped when probed)
and a truncated mp4 (skipped when its last clip fails to decode). The AVR run:
configs/videocc_avr.py:tiny trained by `python -m avtext.main` for 40 steps on exactly
those 16 clips (rendered by the world, not decoded), so it has memorized them: the
check that a clip's generating caption finds its video is a check on training clips
(measured: 16 / 16 in the top 5, 7 / 16 at rank 1; chance 31 % and 6 %). Retrieval of
unseen videos needs a real run: the slow test below uses `make demo`'s.

The AVR run trains in a subprocess with one CPU device (~25 s, mostly XLA compiling on
one core; 8 fake devices take 35 s); its config leaves num_devices unset, so here, with
the 8 devices of tests/conftest.py, the index batches on an 8-device mesh. Meanwhile this
process trains the captioning run (configs/videocc_caption.py:tiny, 1 step, 1 device) and
runs `avtext.caption` with it on the other core.
"""
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import pytest

from avtext import caption
from avtext import cli
from avtext import index as index_lib
from avtext import search_videos
from avtext.data import video_io
from avtext.evals import base as evals_base
from avtext.evals import retrieval as retrieval_eval
from avtext.train import partitioning
from avworld import layouts
from avworld import world
from tests.test_train_trainer import REPO
from tests.test_train_trainer import make_trainer

# The module's fixture trains, indexes and captions a run (minutes): `make test-slow`
# (CI runs both suites).
pytestmark = pytest.mark.slow

SPEC = world.WorldSpec(height=32, width=32, duration_s=2.0)  # the tiny config's world
NUM_VIDEOS = 16
STEPS = 40
CAPTIONED = ('train00000.mp4', 'notes.mp4', 'more/train00012.mp4')


def _cli(module, argv) -> tuple[str, str]:
  """(stdout, stderr) of an entry point run in-process (`avtext.cli.run`); a user error
  (exit 2) is SystemExit."""
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    cli.run(module.main, module.FLAGS, [module.__name__] + list(argv))
  return out.getvalue(), err.getvalue()


def _train_captioner(workdir):
  """configs/videocc_caption.py:tiny with an RGB-only encoder, 1 step on 1 device: cheap,
  and its captions are words (decoding stops no earlier than min_length = 1 token)."""
  from avtext.data import builders  # pylint: disable=g-import-not-at-top
  from avtext.data import pipelines  # pylint: disable=g-import-not-at-top
  from avtext.text import tokenizers  # pylint: disable=g-import-not-at-top
  from configs import videocc_caption  # pylint: disable=g-import-not-at-top
  config = videocc_caption.get_config('tiny')
  config.num_devices = 1
  config.model.video.modalities = 'rgb'
  config.dataset.num_train = NUM_VIDEOS
  config.train.num_steps = config.train.checkpoint_every_steps = 1
  config.evals = {}
  workdir.mkdir()
  train = builders.get_source(config.dataset, 'train')
  tokenizers.write_vocab_subset(pipelines.source_captions(train), workdir / 'vocab.json')
  config.model.decoder.vocab_subset = str(workdir / 'vocab.json')
  make_trainer(config, workdir).train()


@pytest.fixture(scope='module')
def own(tmp_path_factory):
  """{root, layout, videos, captions {id: generating caption}, later (a video not in the
  folder), run (AVR), captioned {'greedy' / 'beam1': avtext.caption's (stdout, stderr)
  on CAPTIONED}}."""
  root = tmp_path_factory.mktemp('own')
  layout = root / 'layout'
  written = layouts.write('msrvtt', layout, sizes={'train': NUM_VIDEOS, 'test': 1}, spec=SPEC,
                          faults=('not_video',), captions_per_clip=1, progress=False)
  media, videos = layout / 'videos' / 'all', root / 'videos'
  (videos / 'more').mkdir(parents=True)
  captions = {}
  for i, stem, caps in written.items['train']:
    if i < 0:
      continue
    name = f'{stem}.mp4' if i < NUM_VIDEOS // 2 else f'more/{stem}.mp4'
    shutil.copy(media / f'{stem}.mp4', videos / name)
    captions[name] = caps[0]
  shutil.copy(media / f"{written.faults['not_video']}.mp4", videos / 'notes.mp4')
  # Passes the probe (headers only), fails when its last clip is decoded.
  src = layouts.source('train', NUM_VIDEOS, SPEC, seed=0)
  video_io.write_fault(videos / 'cut.mp4', 'truncated',
                       src.render_frames(0, np.arange(SPEC.num_frames)), SPEC.fps,
                       audio=src.render_audio(0, 0, SPEC.num_samples),
                       sample_rate=SPEC.sample_rate)
  later = root / 'later.mp4'
  shutil.copy(media / 'test00000.mp4', later)
  run = root / 'run'
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=1')
  avr = subprocess.Popen(
      [sys.executable, '-m', 'avtext.main', '--config=configs/videocc_avr.py:tiny',
       f'--workdir={run}', f'--config.dataset.num_train={NUM_VIDEOS}',
       f'--config.train.num_steps={STEPS}', f'--config.train.checkpoint_every_steps={STEPS}',
       '--config.optimizer.frozen=()', '--config.optimizer.learning_rate=3e-3',
       '--config.optimizer.warmup_steps=0', '--config.optimizer.schedule=constant'],
      cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  try:
    _train_captioner(root / 'caption_run')
    files = [str(videos / name) for name in CAPTIONED]
    captioned = {name: _cli(caption, ['--workdir', str(root / 'caption_run')] + beam + files)
                 for name, beam in (('greedy', []), ('beam1', ['--beam', '1']))}
  finally:
    log, _ = avr.communicate()
  assert avr.returncode == 0, log[-4000:]
  return dict(root=root, layout=layout, videos=videos, captions=captions, later=later, run=run,
              captioned=captioned)


@pytest.fixture(scope='module')
def indexed(own):
  """The folder indexed by `python -m avtext.index` (its main); (index dir, its stdout)."""
  out = own['root'] / 'index'
  printed, _ = _cli(index_lib, ['--workdir', str(own['run']), '--videos', str(own['videos']),
                                     '--out', str(out)])
  return out, printed


@pytest.fixture(scope='module')
def searcher(indexed):
  return search_videos.IndexSearcher(indexed[0])


def test_index_cli_lists_and_counts_the_bad_file(own, indexed):
  out, printed = indexed
  meta = json.loads((out / 'meta.json').read_text())
  assert meta['num_videos'] == NUM_VIDEOS and meta['last_added'] == NUM_VIDEOS
  assert meta['skip_counts'] == {'truncated': 1, 'unreadable': 1}
  assert [(s['path'], s['reason']) for s in meta['skipped']] == [
      ('notes.mp4', 'unreadable'), ('cut.mp4', 'truncated')]
  assert 'skipped: truncated 1, unreadable 1' in printed
  assert 'skipped notes.mp4: unreadable' in printed and 'skipped cut.mp4: truncated' in printed
  assert meta['run'] == {'workdir': str(own['run']), 'step': STEPS,
                         'config_sha256': index_lib.config_hash(own['run'])}
  assert sorted(json.loads((out / 'ids.json').read_text())) == sorted(own['captions'])
  assert np.load(out / 'vectors.npy').shape == (NUM_VIDEOS, meta['dim'])


@pytest.fixture(scope='module')
def evaluator_sim(own, searcher):
  """The retrieval evaluator on the same files, read by the MSR-VTT builder from the
  layout: its similarity [captions, videos] and metrics, the captions, and the index id
  of each caption's video and of each column."""
  emb = searcher.embedder
  assert emb.mesh.size == 8  # the run's mesh: num_devices unset, all 8 test devices
  config = emb.run.config
  cfg = ml_collections.ConfigDict(dict(
      type='retrieval', split='train',
      dataset=dict(name='msrvtt', path=str(own['layout']), short_side=config.data.image_size,
                   num_train=1000)))
  task = emb.task
  ev = retrieval_eval.RetrievalEvaluator('own', cfg, config=config, task=task,
                                         cache=evals_base.PredictCache(task))
  captured = {}

  def capture(sim, *args, **kwargs):
    captured['sim'] = sim
    return original(sim, *args, **kwargs)

  original = retrieval_eval.retrieval_results
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(retrieval_eval, 'retrieval_results', capture)
    variables = jax.device_put(emb.run.variables, partitioning.replicated(emb.mesh))
    results = ev.evaluate(variables, mesh=emb.mesh, step=STEPS)
  assert ev.source.skip_counts() == {'unreadable': 1}  # notes.mp4
  stem_to_id = {name.split('/')[-1][:-4]: name for name in own['captions']}
  of_caption = [stem_to_id[e.video_id] for e in ev.source.entries]
  captions = [e.caption for e in ev.source.entries]
  return captured['sim'], results, captions, of_caption, list(dict.fromkeys(of_caption))


def test_index_scores_are_the_retrieval_evaluators(own, searcher, evaluator_sim):
  sim, results, captions, of_caption, videos = evaluator_sim
  assert sim.shape == (NUM_VIDEOS, NUM_VIDEOS)
  found = searcher.texts(captions, top=NUM_VIDEOS)
  index_sim = np.array([[dict(f)[v] for v in videos] for f in found])
  np.testing.assert_allclose(index_sim, sim, rtol=1e-4, atol=1e-5)
  for f in found:  # best first
    assert [s for _, s in f] == sorted((s for _, s in f), reverse=True)
  # The evaluator's metrics follow from the index's scores.
  t2v, v2t, _ = retrieval_eval.ground_truth(of_caption, len(captions))
  again = retrieval_eval.retrieval_results(index_sim, t2v, v2t, ml_collections.ConfigDict())
  for key in ('t2v_R@1', 't2v_R@5', 't2v_MnR', 't2v_mAP', 'v2t_R@1', 'v2t_MnR', 'v2t_mAP'):
    assert again[key] == pytest.approx(results[key]), key


def test_generating_caption_finds_its_training_video(own, searcher):
  names = list(own['captions'])
  found = searcher.texts([own['captions'][n] for n in names], top=5)
  top1 = sum(f[0][0] == n for n, f in zip(names, found))
  top5 = sum(n in [v for v, _ in f] for n, f in zip(names, found))
  print(f'\n{NUM_VIDEOS} training videos, their captions: top 1 {top1}, top 5 {top5} '
        f'(chance 1 and 5)')
  assert top5 >= 12 and top1 >= 4, (top1, top5)  # measured 16 and 7


def test_reindexing_adds_only_new_files_and_keeps_one_run(own, searcher, tmp_path):
  folder, out = tmp_path / 'videos', tmp_path / 'index'
  (folder / 'more').mkdir(parents=True)
  names = ['train00001.mp4', 'notes.mp4', 'more/train00011.mp4']
  for name in names:
    shutil.copy(own['videos'] / name, folder / name)
  emb = searcher.embedder
  first = index_lib.build(own['run'], folder, out, embedder=emb, progress=False)
  before = np.load(out / 'vectors.npy')
  rows = [searcher.index.ids.index(n) for n in ('more/train00011.mp4', 'train00001.mp4')]
  np.testing.assert_allclose(before, searcher.index.vectors[rows], rtol=1e-5, atol=1e-6)
  (folder / 'new').mkdir()
  shutil.copy(own['later'], folder / 'new' / 'later.mp4')
  second = index_lib.build(own['run'], folder, out, embedder=emb, progress=False)
  assert (first['num_videos'], second['num_videos'], second['last_added']) == (2, 3, 1)
  assert second['skip_counts'] == {'unreadable': 1}  # notes.mp4 is tried again
  assert json.loads((out / 'ids.json').read_text()) == [
      'more/train00011.mp4', 'train00001.mp4', 'new/later.mp4']
  after = np.load(out / 'vectors.npy')
  np.testing.assert_array_equal(after[:2], before)
  # The added row is the file embedded alone (one file in a padded batch of 8).
  alone, _ = emb.embed_videos(emb.source([str(folder / 'new' / 'later.mp4')], ['x'], 'later',
                                         progress=False), progress=False)
  np.testing.assert_allclose(after[2], alone[0], rtol=1e-5, atol=1e-6)
  # One run, one step, one folder per index.
  other = tmp_path / 'other_run'
  shutil.copytree(own['run'], other)
  with pytest.raises(ValueError, match="an index holds one run's embeddings"):
    index_lib.build(other, folder, out, progress=False)
  with pytest.raises(ValueError, match='an index of the videos under'):
    index_lib.build(own['run'], own['videos'], out, embedder=emb, progress=False)


def test_search_cli_text_and_video(own, indexed, searcher):
  index, _ = indexed
  query = own['captions']['more/train00009.mp4']
  out, _ = _cli(search_videos, ['--index', str(index), '--top', '3', query])
  expected = searcher.texts([query], top=3)[0]
  assert out.strip().splitlines() == [f'query: {query}'] + [
      f'  {r:3d}. {s:8.4f}  {v}' for r, (v, s) in enumerate(expected, 1)]
  captions = own['root'] / 'captions.txt'
  captions.write_text('\n'.join(own['captions'].values()) + '\n')
  video = own['videos'] / 'more' / 'train00009.mp4'
  out, _ = _cli(search_videos, ['--index', str(index), '--video', str(video), '--captions',
                                str(captions), '--top', str(NUM_VIDEOS), '--json'])
  line = json.loads(out)
  assert line['video'] == str(video)
  assert sorted(c['caption'] for c in line['captions']) == sorted(own['captions'].values())
  # video -> text scores a (video, caption) pair as text -> video does.
  v2t = {c['caption']: c['score'] for c in line['captions']}
  t2v = dict(searcher.texts([query], top=NUM_VIDEOS)[0])
  assert v2t[query] == pytest.approx(t2v['more/train00009.mp4'], rel=1e-5, abs=1e-6)
  for argv, message in ((['--index', str(index)], 'give a query'),
                        (['--index', str(index), '--workdir', 'x', 'q'], 'unknown flag --workdir'),
                        (['--index', str(index), '--video', str(video)], '--captions'),
                        (['--index', str(index), '--captions', str(captions), 'q'],
                         'goes with --video')):
    with pytest.raises(SystemExit) as e:
      _cli(search_videos, argv)
    assert e.value.code == 2


def test_search_expands_tilde_in_index_and_video(own, indexed, searcher, monkeypatch):
  """bash does not expand ~ after --flag=; the CLIs do (the README's own examples)."""
  index, _ = indexed
  monkeypatch.setenv('HOME', str(index.parent))
  query = own['captions']['more/train00009.mp4']
  out, _ = _cli(search_videos, [f'--index=~/{index.name}', '--top', '2', query])
  assert out.strip().splitlines()[1:] == [
      f'  {r:3d}. {s:8.4f}  {v}' for r, (v, s) in enumerate(searcher.texts([query], 2)[0], 1)]
  captions = index.parent / 'caps.txt'
  captions.write_text(query + '\nsomething else\n')
  shutil.copy(own['videos'] / 'more' / 'train00009.mp4', index.parent / 'clip.mp4')
  out, _ = _cli(search_videos, [f'--index=~/{index.name}', '--video=~/clip.mp4',
                                '--captions=~/caps.txt', '--json'])
  assert json.loads(out)['video'] == str(index.parent / 'clip.mp4')


def test_reindexing_drops_removed_and_reembeds_changed_files(own, searcher, tmp_path):
  folder, out = tmp_path / 'videos', tmp_path / 'index'
  folder.mkdir()
  for name in ('a.mp4', 'b.mp4', 'c.mp4'):
    shutil.copy(own['videos'] / 'train00001.mp4', folder / name)
  emb = searcher.embedder
  first = index_lib.build(own['run'], folder, out, embedder=emb, progress=False)
  assert (first['num_videos'], first['last_added']) == (3, 3)
  (folder / 'a.mp4').unlink()
  shutil.copy(own['videos'] / 'more' / 'train00009.mp4', folder / 'b.mp4')  # overwritten
  second = index_lib.build(own['run'], folder, out, embedder=emb, progress=False)
  assert (second['num_videos'], second['last_added'], second['last_updated'],
          second['last_removed']) == (2, 0, 1, 1)
  assert json.loads((out / 'ids.json').read_text()) == ['c.mp4', 'b.mp4']
  vectors = np.load(out / 'vectors.npy')
  rows = {n: searcher.index.ids.index(n) for n in ('train00001.mp4', 'more/train00009.mp4')}
  np.testing.assert_allclose(vectors[1], searcher.index.vectors[rows['more/train00009.mp4']],
                             rtol=1e-5, atol=1e-6)  # b.mp4 is the new file's embedding
  np.testing.assert_allclose(vectors[0], searcher.index.vectors[rows['train00001.mp4']],
                             rtol=1e-5, atol=1e-6)
  found = search_videos.IndexSearcher(out, embedder=emb).texts(['anything'], top=5)[0]
  assert sorted(v for v, _ in found) == ['b.mp4', 'c.mp4']  # a.mp4 is gone
  third = index_lib.build(own['run'], folder, out, embedder=emb, progress=False)
  assert (third['last_added'], third['last_updated'], third['last_removed']) == (0, 0, 0)


def test_caption_cli_greedy_equals_beam_one(own):
  (greedy, greedy_err), (beam1, _) = own['captioned']['greedy'], own['captioned']['beam1']
  assert greedy == beam1
  files = [str(own['videos'] / name) for name in CAPTIONED]
  lines = [l.split('\t') for l in greedy.strip().splitlines()]
  assert [l[0] for l in lines] == [files[0], files[2]] and all(l[1].strip() for l in lines)
  assert f'{files[1]}\t[skipped: unreadable' in greedy_err


def test_nothing_captioned_exits_1_and_a_cut_query_says_so(own, indexed):
  """Issue 46 part 3: `caption` over files that all fail ends non-zero with one line; a
  12k-character query is searched by its first tokens, and the user is told."""
  out, err = io.StringIO(), io.StringIO()
  with pytest.raises(SystemExit) as done, contextlib.redirect_stdout(out), \
      contextlib.redirect_stderr(err):
    cli.run(caption.main, caption.FLAGS, ['avtext.caption', '--workdir',
                                          str(own['root'] / 'caption_run'),
                                          str(own['videos'] / 'notes.mp4'),
                                          str(own['root'] / 'gone.mp4')])
  lines = err.getvalue().strip().splitlines()
  assert done.value.code == 1 and not out.getvalue(), err.getvalue()
  assert lines[-1].startswith('error: none of the 2 file(s) could be captioned'), lines
  assert 'Traceback' not in err.getvalue() and len(lines) <= 6, lines
  _, err = _cli(search_videos, ['--index', str(indexed[0]), 'red ' * 3000])
  assert 'note: query 1 (12000 characters) is 3002 tokens long; only its first' in err, err


@pytest.mark.slow
def test_demo_run_finds_own_videos_by_their_captions(tmp_path):
  """With `make demo`'s trained AVR run: 50 mp4s of the world's test split (never
  trained on), indexed; each generating caption must rank its video in the top 5 far
  above chance (10 %; BENCHMARKS.md measured 92 %)."""
  from benchmarks import common  # pylint: disable=g-import-not-at-top
  run = REPO / 'workdirs' / 'demo' / 'avr'
  if not (run / 'results.json').exists():
    pytest.skip(f'needs {run}: make workdirs/demo/avr/results.json')
  captions = common.own_videos(tmp_path, 50, world.WorldSpec())
  index_lib.build(run, tmp_path / 'videos', tmp_path / 'index', progress=False)
  rec, _ = common.caption_recall(search_videos.IndexSearcher(tmp_path / 'index'), captions)
  assert rec[5] >= 60, rec
