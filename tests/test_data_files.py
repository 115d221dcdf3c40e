"""Real files in: the four builders on files the test writes from the synthetic world,
the corrupt-input corpus, materializing to array_record, and training over bad files."""
import json

import ml_collections
import numpy as np
import pytest

from avtext.data import builders
from avtext.data import clip_export
from avtext.data import video_io
from avtext.data.builders import media_clips
from avtext.data.builders import videocc3m
from avworld import clips
from avworld import layouts
from avworld import world

SPEC = world.WorldSpec(height=32, width=32, duration_s=2.0)
SIZES = {'train': 8, 'val': 2, 'test': 8}
# H.264 at crf 18 on flat-coloured 32x32 frames: mean |error| is ~2-4 grey levels.
FRAME_TOL = 6.0


def _open(name, path, split, **fields):
  return builders.get_source(ml_collections.ConfigDict(
      {'name': name, 'path': str(path), 'progress': False, **fields}), split)


@pytest.fixture(scope='module')
def msrvtt(tmp_path_factory):
  root = tmp_path_factory.mktemp('msrvtt')
  return layouts.write('msrvtt', root, sizes=SIZES, spec=SPEC, faults=layouts.FAULTS,
                       progress=False)


def _reference(split, n=None):
  return clips.ClipCaptionSource(split, seed=0, num_examples=n or SIZES[split], spec=SPEC)


def _audio_matches(got, want):
  """AAC is lossy and noise-like sounds lose most: compare shapes, not samples."""
  assert got.shape == want.shape
  if np.abs(want).max() < 1e-3:
    return
  corr = np.corrcoef(got, want)[0, 1]
  assert corr > 0.9, corr


def test_msrvtt_splits_decode_the_synthetic_source(msrvtt):
  ref = _reference('test')
  test = _open('msrvtt', msrvtt.root, 'test')
  assert len(test) == 8 and test.skip_counts() == {}
  for i in (0, 5):
    ex, want = test[i], ref[i]
    assert ex['caption'] == want['caption'] and ex['video_id'] == f'test{i:05d}'
    assert ex['frames'].shape == want['frames'].shape == (50, 32, 32, 3)
    assert np.abs(ex['frames'].astype(int) - want['frames']).mean() < FRAME_TOL
    _audio_matches(ex['audio'], want['audio'])
  # test_full: every caption of the official test videos, grouped by video.
  full = _open('msrvtt', msrvtt.root, 'test_full')
  assert len(full) == 16
  assert [full.describe(i)['video_id'] for i in (0, 1, 2)] == ['test00000'] * 2 + ['test00001']
  # train: the 9k rule (every video not in the 1k-A list), one entry per caption.
  train = _open('msrvtt', msrvtt.root, 'train')
  assert len(train) + sum(train.skip_counts().values()) == 2 * (8 + 2 + len(layouts.FAULTS))


def test_clip_of_a_longer_file_is_cut_and_padded(tmp_path):
  """videocc3m: [start, end) of a whole video; a clip past the file's end keeps the
  frames there are and pads the audio with zeros (VideoCC app. C)."""
  src = _reference('train', 2)
  frames = src.render_frames(0, np.arange(50))
  audio = src.render_audio(0, 0, 32000)
  (tmp_path / 'videos').mkdir()
  video_io.write_video(tmp_path / 'videos' / 'abc.mp4', frames, 25, audio=audio)
  (tmp_path / 'video_cc_public.csv').write_text(
      'video_url,start,end,caption\n'
      'https://www.youtube.com/watch?v=abc,500000,1500000,inside\n'
      'abc,1200000,3200000,past the end\n')
  assert len(_open('videocc3m', tmp_path, 'train')) == 1  # 0.8 s < min_seconds 1 s: short
  ds = _open('videocc3m', tmp_path, 'train', min_seconds=0.5)
  assert len(ds) == 2 and [ds.describe(i)['video_id'] for i in (0, 1)] == ['abc', 'abc']
  inside, past = ds[0], ds[1]
  assert inside['frames'].shape[0] == 25  # 1 s at 25 fps
  want = src.render_frames(0, 12 + np.arange(25))  # frame k on screen at 0.5 + k / 25 s
  assert np.abs(inside['frames'].astype(int) - want).mean() < FRAME_TOL
  assert past['frames'].shape[0] == 20  # 0.8 s of the 2 s span lie inside the file
  assert past['audio'].shape == (32000,)
  assert np.all(past['audio'][int(0.8 * 16000) + 1024:] == 0)  # zeros past the end
  assert np.abs(past['audio'][:int(0.7 * 16000)]).mean() > 0


def test_videocc_csv_errors_name_file_and_line(tmp_path):
  bad = tmp_path / 'bad.csv'
  bad.write_text('abc,10,5,backwards\n')
  with pytest.raises(ValueError, match=r'bad.csv:1: end 5 µs is not after start 10 µs'):
    videocc3m.read_csv(bad)
  bad.write_text('abc,0,5,a,b\n')
  with pytest.raises(ValueError, match=r'bad.csv:1: expected 4 columns'):
    videocc3m.read_csv(bad)
  with pytest.raises(FileNotFoundError, match='video_cc_public.csv: not found'):
    _open('videocc3m', tmp_path, 'train')
  with pytest.raises(FileNotFoundError, match='config.dataset.path: set it'):
    builders.get_source(ml_collections.ConfigDict({'name': 'msrvtt'}), 'test')


@pytest.mark.parametrize('layout', ['audiocaps', 'clotho'])
def test_audio_datasets_read_the_wavs(tmp_path, layout):
  w = layouts.write(layout, tmp_path, sizes={'train': 2, 'val': 1, 'test': 3}, spec=SPEC,
                    faults=layouts.FAULTS, progress=False)
  ref = _reference('test', 3)
  test = _open(layout, w.root, 'test')
  per_clip = 5 if layout == 'clotho' else 1
  assert len(test) == 3 * per_clip
  d = test.describe(per_clip)  # clip 1's first caption
  assert d['video_id'].startswith('test00001') and d['caption'] == ref.describe(1)['caption']
  got = test.render_audio(per_clip)
  # AudioCaps clips are 10 s segments: a 2 s file is padded with zeros.
  assert got.shape == ((160000,) if layout == 'audiocaps' else (32000,))
  assert not got[32000:].any()
  # 16-bit PCM: the samples themselves, within quantization.
  np.testing.assert_allclose(got[:32000], ref.render_audio(1, 0, 32000), atol=0.5 / 32768 + 1e-7)
  with pytest.raises(ValueError, match='no frames to read'):
    test.render_frames(0, [0])
  # An audio dataset keeps an audio-only file and skips one without sound.
  train = _open(layout, w.root, 'train')
  # (a .wav cut short is seen from its RIFF header: FFmpeg would call it a shorter file)
  expect = {layouts.OUTCOMES['audio'][f] for f in layouts.FAULTS} - {'kept'}
  assert set(train.skip_counts()) == expect
  assert sum(train.skip_counts().values()) == per_clip * len(expect)


def test_corrupt_inputs_get_their_documented_outcome(msrvtt):
  train = _open('msrvtt', msrvtt.root, 'train')
  skipped = {s.path.rsplit('/', 1)[-1].split('.')[0]: s.reason for s in train.skipped}
  want = {f'fault_{f}': r for f, r in layouts.OUTCOMES['video'].items()
          if r not in ('kept', 'truncated')}
  assert skipped == want  # the truncated file opens: probing cannot see it
  kept = {train.describe(i)['path'].rsplit('/', 1)[-1]: i for i in range(len(train))}
  no_audio = kept['fault_no_audio.mp4']
  assert train.describe(no_audio)['has_audio'] is False
  assert np.all(train[no_audio]['audio'] == 0)  # zeros, flagged, not a silent clip
  truncated = kept['fault_truncated.mp4']
  with pytest.raises(video_io.VideoReadError, match='fault_truncated.mp4: truncated'):
    train[truncated]
  # verify="decode" finds it when the split opens.
  checked = _open('msrvtt', msrvtt.root, 'train', verify='decode')
  assert checked.skip_counts()['truncated'] == 2  # both of its captions
  # on_bad="raise" names the first bad file.
  with pytest.raises(video_io.VideoReadError, match=r'fault_\w+\.mp4'):
    _open('msrvtt', msrvtt.root, 'train', on_bad='raise')


def test_a_file_failing_mid_read_is_replaced_in_training_only(msrvtt):
  from avtext.data import pipelines  # pylint: disable=g-import-not-at-top
  train = _open('msrvtt', msrvtt.root, 'train')
  reader = pipelines.ClipReader(train)
  idx = next(i for i in range(len(train))
             if train.describe(i)['path'].endswith('fault_truncated.mp4'))
  frame_fn = lambda n: np.arange(min(n, 40))[None]
  out = reader.read(idx, frame_fn, lambda i, n: [(0, 100)], ('rgb',))
  nxt = next(j for j in range(idx + 1, len(train))
             if not train.describe(j)['path'].endswith('fault_truncated.mp4'))
  assert out['caption'] == train.describe(nxt)['caption']
  assert train.skip_counts()['truncated'] == 2
  # The same choice in a fresh process (a resumed run): it depends on the files only.
  again = pipelines.ClipReader(_open('msrvtt', msrvtt.root, 'train')).read(
      idx, frame_fn, lambda i, n: [(0, 100)], ('rgb',))
  assert again['caption'] == out['caption']
  np.testing.assert_array_equal(again['frames'], out['frames'])
  # An evaluation split does not substitute: the error names the file.
  test = media_clips.MediaClips([media_clips.Entry(train.describe(idx)['path'], 'x', 'x')],
                                where='an eval split', progress=False)
  with pytest.raises(video_io.VideoReadError, match='truncated'):
    pipelines.ClipReader(test).read(0, frame_fn, lambda i, n: [(0, 100)], ('rgb',))


def test_probe_cache_is_reused_until_a_file_changes(msrvtt, tmp_path):
  cache = tmp_path / 'probe.json'
  paths = [str(p) for p in sorted((msrvtt.root / 'videos' / 'all').glob('test*.mp4'))]
  first = media_clips.probe_files(paths, cache=cache)
  assert json.loads(cache.read_text())[paths[0]]['result'] == first[paths[0]]
  stored = json.loads(cache.read_text())
  stored[paths[0]]['result'] = {'reason': 'empty', 'detail': 'from the cache'}
  cache.write_text(json.dumps(stored))
  assert media_clips.probe_files(paths, cache=cache)[paths[0]]['detail'] == 'from the cache'
  stored[paths[0]]['key'] = 'stale'
  cache.write_text(json.dumps(stored))
  assert media_clips.probe_files(paths, cache=cache)[paths[0]] == first[paths[0]]


@pytest.mark.parametrize('fmt', ['tfds', 'frames_raw'])
def test_materialized_split_reads_back_the_same_clips(msrvtt, tmp_path, fmt):
  ds = ml_collections.ConfigDict({'name': 'msrvtt', 'path': str(msrvtt.root),
                                  'progress': False})
  summary = clip_export.materialize(ds, ['train', 'test'], name='msrvtt_tiny',
                                    data_dir=tmp_path, fmt=fmt)
  lazy_train = builders.get_source(ds, 'train')
  want = dict(lazy_train.skip_counts())
  want['truncated'] = 2  # found while writing
  assert summary['train'] == {'records': len(lazy_train) - 2, 'skipped': want}
  assert json.loads((tmp_path / 'msrvtt_tiny' / 'skipped.json').read_text())['splits'] == summary
  read = ml_collections.ConfigDict({'name': clip_export.READ_NAME[fmt].format(
      name='msrvtt_tiny'), 'data_dir': str(tmp_path)})
  assert len(builders.get_source(read, 'train')) == summary['train']['records']
  stored = builders.get_source(read, 'test')
  lazy = builders.get_source(ds, 'test')
  assert len(stored) == len(lazy) == 8
  text = lambda v: v.decode() if isinstance(v, bytes) else v  # noqa: E731  (TFDS: bytes)
  for i in (0, 7):
    a, b = stored[i], lazy[i]
    np.testing.assert_array_equal(a['frames'], b['frames'])
    np.testing.assert_array_equal(a['audio'], b['audio'])
    assert text(a['caption']) == b['caption'] and text(a['video_id']) == b['video_id']


@pytest.mark.slow  # `make test` budget: `make test-slow` (CI runs both)
def test_training_over_bad_files_finishes_and_reports_the_skips(msrvtt, tmp_path):
  from tests.test_train_trainer import make_trainer  # pylint: disable=g-import-not-at-top
  from tests.test_train_trainer import tiny_config  # pylint: disable=g-import-not-at-top
  config = tiny_config(**{'train.num_steps': 4, 'train.batch_size': 8,
                          'train.log_every_steps': 1, 'eval.batch_size': 8})
  config.dataset = ml_collections.ConfigDict({'name': 'msrvtt', 'path': str(msrvtt.root),
                                              'progress': False})
  # Every train entry is read (4 x 8 > 28), so the truncated file is hit too.
  make_trainer(config, tmp_path).train()
  results = json.loads((tmp_path / 'results.json').read_text())
  skipped = results['train_data']['skipped']
  assert skipped == {'empty': 2, 'missing': 2, 'no_video': 2, 'short': 2, 'truncated': 2,
                     'unreadable': 2}
  assert results['train_data']['examples'] == 2 * (8 + 2 + 7) - 10
  assert results['latest']['test/t2v_R@1'] >= 0  # the 1k-A-style split, 8 videos
