"""Your own videos: `avtext.index` over a folder of mp4s and `avtext.search --index`."""
import json
import shutil

import jax
import numpy as np
import pytest

from avtext import index as index_lib
from avtext import search
from avtext.data.synthetic import layouts
from avtext.data.synthetic import world
from avtext.evals import base as evals_base
from avtext.train import partitioning
from tests.test_trainer import make_trainer
from tests.test_trainer import tiny_config

SPEC = world.WorldSpec(height=32, width=32, duration_s=2.0)


@pytest.fixture(scope='module')
def setup(tmp_path_factory):
  root = tmp_path_factory.mktemp('own')
  run = root / 'run'
  make_trainer(tiny_config(**{'train.num_steps': 2}), run).train()
  written = layouts.write('msrvtt', root / 'data', sizes={'train': 1, 'val': 1, 'test': 8},
                          spec=SPEC, faults=('not_video',), progress=False)
  videos = root / 'videos'
  videos.mkdir()
  for _, stem, caps in written.items['test']:
    shutil.copy(root / 'data' / 'videos' / 'all' / f'{stem}.mp4', videos / f'{stem}.mp4')
  shutil.copy(root / 'data' / 'videos' / 'all' / 'fault_not_video.mp4', videos / 'notes.mp4')
  captions = {f'{stem}.mp4': caps[0] for _, stem, caps in written.items['test']}
  return run, videos, captions, root


def test_index_scores_are_the_retrieval_evaluators(setup):
  run, videos, captions, root = setup
  meta = index_lib.build(run, videos, root / 'index', progress=False)
  assert meta['num_videos'] == 8 and meta['skip_counts'] == {'unreadable': 1}
  assert meta['skipped'][0]['path'] == 'notes.mp4'
  searcher = search.IndexSearcher(root / 'index')
  ids = searcher.index.ids
  texts = [captions[v] for v in ids]
  found = searcher.texts(texts, top=8)
  # Second computation: the evaluator's path (eval examples batched on the 8-device mesh
  # by map_examples, the task's predict functions) and its K-clip score average.
  emb = searcher.embedder
  source = emb.source([str(videos / v) for v in ids], ids, 'check')
  examples = emb.task.eval_examples(source)
  fns = emb.task.predict_fns()
  mesh = partitioning.make_mesh()
  variables = jax.device_put(emb.run.variables, partitioning.replicated(mesh))
  fn = jax.jit(lambda v, b: {'video': fns['embed_video'](v, b)})
  out, _ = evals_base.map_examples(lambda b: fn(variables, b), examples, len(ids), mesh=mesh,
                                   global_batch_size=8)
  text = emb.embed_texts(texts)
  sim = np.einsum('qd,nkd->qn', text, out['video']) / out['video'].shape[1]
  for q, ranked in enumerate(found):
    got = {v: s for v, s in ranked}
    np.testing.assert_allclose([got[v] for v in ids], sim[q], rtol=1e-4, atol=1e-5)
    assert [v for v, _ in ranked] == [ids[i] for i in np.argsort(-sim[q], kind='stable')]


def test_reindexing_adds_only_new_files_and_keeps_one_run(setup, tmp_path):
  run, videos, _, root = setup
  folder = tmp_path / 'videos'
  shutil.copytree(videos, folder)
  (folder / 'notes.mp4').unlink()
  moved = folder / 'test00007.mp4'
  moved.rename(tmp_path / 'later.mp4')
  first = index_lib.build(run, folder, tmp_path / 'index', progress=False)
  assert first['num_videos'] == 7 and first['last_added'] == 7
  before = np.load(tmp_path / 'index' / 'vectors.npy')
  (folder / 'sub').mkdir()
  (tmp_path / 'later.mp4').rename(folder / 'sub' / 'later.mp4')
  second = index_lib.build(run, folder, tmp_path / 'index', progress=False)
  assert second['num_videos'] == 8 and second['last_added'] == 1
  ids = json.loads((tmp_path / 'index' / 'ids.json').read_text())
  assert ids[-1] == 'sub/later.mp4'
  np.testing.assert_array_equal(np.load(tmp_path / 'index' / 'vectors.npy')[:7], before)
  # Another run's embeddings do not mix in.
  other = tmp_path / 'other'
  shutil.copytree(run, other)
  with pytest.raises(ValueError, match='an index holds one run'):
    index_lib.build(other, folder, tmp_path / 'index', progress=False)


def test_search_cli_text_and_video(setup, capsys):
  _, videos, captions, root = setup
  if not (root / 'index' / 'meta.json').exists():
    index_lib.build(setup[0], videos, root / 'index', progress=False)
  search.main(['--index', str(root / 'index'), '--top', '3', '--json', captions['test00002.mp4']])
  line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert line['query'] == captions['test00002.mp4'] and len(line['videos']) == 3
  assert line['videos'][0]['score'] >= line['videos'][1]['score'] >= line['videos'][2]['score']
  caps = root / 'caps.txt'
  caps.write_text('\n'.join(captions.values()) + '\n')
  search.main(['--index', str(root / 'index'), '--video', str(videos / 'test00002.mp4'),
               '--captions', str(caps), '--json', '--top', '8'])
  line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert sorted(c['caption'] for c in line['captions']) == sorted(captions.values())
  # video -> text ranks with the same score as text -> video for the same pair.
  t2v = search.IndexSearcher(root / 'index').texts([captions['test00002.mp4']], top=8)[0]
  score = dict(t2v)['test00002.mp4']
  v2t = {c['caption']: c['score'] for c in line['captions']}
  assert v2t[captions['test00002.mp4']] == pytest.approx(score, rel=1e-4, abs=1e-5)


@pytest.mark.slow
def test_demo_run_finds_own_videos_by_their_captions(tmp_path):
  """With `make demo`'s trained AVR run: 50 mp4s of the world's test split, indexed; each
  generating caption must rank its video in the top 5 far above chance (10 %)."""
  from benchmarks import index_throughput  # pylint: disable=g-import-not-at-top
  from tests.test_trainer import REPO  # pylint: disable=g-import-not-at-top
  run = REPO / 'workdirs' / 'demo' / 'avr'
  if not (run / 'results.json').exists():
    pytest.skip(f'needs {run}: make workdirs/demo/avr/results.json')
  captions = index_throughput.own_videos(tmp_path, 50, world.WorldSpec())
  index_lib.build(run, tmp_path / 'videos', tmp_path / 'index', progress=False)
  rec, _ = index_throughput.recall(search.IndexSearcher(tmp_path / 'index'), captions)
  assert rec[5] >= 30, rec


@pytest.mark.slow  # a captioning run costs ~1 min to compile (test_captioning.py is slow too)
def test_caption_cli_on_own_files(setup, tmp_path, capsys):
  from avtext import caption  # pylint: disable=g-import-not-at-top
  from avtext.data import builders  # pylint: disable=g-import-not-at-top
  from avtext.data import pipelines  # pylint: disable=g-import-not-at-top
  from avtext.data import preprocessing  # pylint: disable=g-import-not-at-top
  from configs import videocc_caption  # pylint: disable=g-import-not-at-top
  _, videos, _, _ = setup
  config = videocc_caption.get_config('tiny')
  config.train.num_steps = 2
  config.evals = {}
  train = builders.get_source(config.dataset, 'train')
  preprocessing.write_vocab_subset(pipelines.source_captions(train), tmp_path / 'vocab.json')
  config.model.decoder.vocab_subset = str(tmp_path / 'vocab.json')
  make_trainer(config, tmp_path / 'cap').train()
  files = [str(videos / 'test00000.mp4'), str(videos / 'test00001.mp4'), str(videos / 'notes.mp4')]
  greedy = caption.caption_files(tmp_path / 'cap', files)
  beam1 = caption.caption_files(tmp_path / 'cap', files, beam=1)
  assert greedy == beam1
  assert all(c for _, c, _ in greedy[:2]) and greedy[2][1] is None
  assert greedy[2][2].startswith('unreadable')
  caption.main(['--run', str(tmp_path / 'cap'), '--beam', '2'] + files[:1])
  path, text = capsys.readouterr().out.strip().split('\t')
  assert path == files[0] and text
