"""The real S-MiT layout (`smit` builder) on files written from the synthetic S-MiT: what it
decodes equals what the world rendered, the S-MiT task reads it as it reads the world, bad
videos and bad spoken captions are counted by reason, bad lists are errors naming the line."""
import ml_collections
import numpy as np
import pytest

from avtext.data import builders
from avtext.data import video_io
from avtext.data.builders import smit as smit_builder
from avtext.tasks import task_registry
from avworld import datasets
from avworld import layouts
from avworld import world
from configs import smit_language_amm
from configs import smit_spoken_amm

SPEC = world.WorldSpec(height=32, width=32, duration_s=3.0)
SIZES = {'train': 4, 'val': 2, 'test': 4}
FRAME_TOL = 6.0  # H.264 crf 18 on flat 32x32 frames (as tests/test_data_files.py)
PCM_TOL = 0.5 / 32768 + 1e-7  # a 16-bit wav holds a float sample to half a step


def _open(path, split, **fields):
  return builders.get_source(ml_collections.ConfigDict(
      {'name': 'smit', 'path': str(path), 'progress': False, **fields}), split)


@pytest.fixture(scope='module')
def smit(tmp_path_factory):
  root = tmp_path_factory.mktemp('smit')
  return layouts.write('smit', root, sizes=SIZES, spec=SPEC, progress=False,
                       faults=('empty', 'not_video', 'missing'))


def test_layout_reads_back_the_synthetic_source(smit):
  ref = datasets.SyntheticSpokenClips('test', num_examples=SIZES['test'], spec=SPEC)
  test = _open(smit.root, 'test')
  assert len(test) == 4 and test.skip_counts() == {}
  for i in (0, 3):
    d, want = test.describe(i), ref.describe(i)
    assert d['clip_id'] == f'test{i:05d}' and d['transcript'] == want['transcript']
    assert d['transcript'] != want['caption']  # the ASR text, with its word errors
    np.testing.assert_allclose(test.render_speech(i), ref.render_speech(i), atol=PCM_TOL)
    idx = np.array([0, 25, 74])
    got = test.render_frames(i, idx).astype(int)
    assert np.abs(got - ref.render_frames(i, idx)).mean() < FRAME_TOL
  # the whole clip, as materialize stores it
  ex = test[1]
  assert ex['transcript'] == ref.describe(1)['transcript']
  assert ex['frames'].shape == (75, 32, 32, 3) and ex['spoken_caption'].ndim == 1


def test_smit_task_reads_the_layout_as_the_world(smit):
  """The examples phase 2 and `smit_features` build: frames within codec error, the
  spoken caption's log-mel as the world's, the transcript's tokens identical."""
  ref = datasets.SyntheticSpokenClips('test', num_examples=SIZES['test'], spec=SPEC)
  test = _open(smit.root, 'test')
  for get_config in (smit_spoken_amm.get_config, smit_language_amm.get_config):
    config = get_config('tiny,phase2')
    task = task_registry.build_task(config)
    real, world_ex = task.examples(test, train=False), task.examples(ref, train=False)
    for i in (0, 2):
      a, b = real(i), world_ex(i)
      assert a['clip_id'] == f'test{i:05d}'  # the world names it clips-test-s0-<i>
      assert np.abs(a['image_frames'] - b['image_frames']).mean() < 0.1  # normalized pixels
      if 'log_mel' in a:
        np.testing.assert_array_equal(a['log_mel_mask'], b['log_mel_mask'])
        real_frames = b['log_mel_mask'] == 1
        corr = np.corrcoef(a['log_mel'][real_frames].ravel(),
                           b['log_mel'][real_frames].ravel())[0, 1]
        assert corr > 0.999, corr
      else:
        for key in ('input_ids', 'attention_mask', 'word_index'):
          np.testing.assert_array_equal(a[key], b[key])


def test_bad_videos_and_bad_spoken_captions_are_counted(smit, tmp_path):
  train = _open(smit.root, 'train')
  assert len(train) == SIZES['train']
  assert train.skip_counts() == {'empty': 1, 'missing': 1, 'unreadable': 1}
  # A spoken caption that is a zero-byte file and one that is gone: their rows are put
  # aside (counted under the reasons of every file) when the captions are read...
  root = tmp_path / 'copy'
  (root / 'videos').mkdir(parents=True)
  (root / 'spoken').mkdir()
  for name in ('train.csv', 'test.csv'):
    (root / name).write_bytes((smit.root / name).read_bytes())
  for i in range(SIZES['test']):
    stem = f'test{i:05d}'
    (root / 'videos' / f'{stem}.mp4').symlink_to(smit.root / 'videos' / f'{stem}.mp4')
    if i != 3:
      (root / 'spoken' / f'{stem}.wav').write_bytes(
          b'' if i == 1 else (smit.root / 'spoken' / f'{stem}.wav').read_bytes())
  test = _open(root, 'test')
  assert test.skip_counts() == {'empty': 1, 'missing': 1}
  assert sorted(s.path.rsplit('/', 1)[-1] for s in test.skipped) == ['test00001.wav',
                                                                     'test00003.wav']
  assert [test.describe(i)['clip_id'] for i in range(len(test))] == ['test00000', 'test00002']
  # ... and kept when they are not (a language-caption model: dataset.spoken=False).
  text_only = _open(root, 'test', spoken=False)
  assert len(text_only) == 4 and text_only.skip_counts() == {}
  with pytest.raises(ValueError, match='config.dataset.spoken=False'):
    text_only.render_speech(0)
  with pytest.raises(video_io.VideoReadError, match=r'test00001\.wav'):
    _open(root, 'test', on_bad='raise')


def test_lists_say_what_is_wrong(tmp_path):
  with pytest.raises(FileNotFoundError, match='config.dataset.path: set it to your S-MiT'):
    builders.get_source(ml_collections.ConfigDict(dict(name='smit')), 'train')
  with pytest.raises(FileNotFoundError, match=r'val.csv: not found \(the S-MiT val list\)'):
    _open(tmp_path, 'validation')
  header = 'video_id,video,spoken_caption,transcript\n'
  (tmp_path / 'test.csv').write_text('video_id,video,transcript\nv,v.mp4,a dog\n')
  with pytest.raises(ValueError, match=r"test.csv: no column \['spoken_caption'\]"):
    _open(tmp_path, 'test')
  (tmp_path / 'test.csv').write_text(header + 'v0,v0.mp4,v0.wav,a dog\nv1,v1.mp4,v1.wav,\n')
  with pytest.raises(ValueError, match="test.csv, line 3: empty 'transcript'"):
    _open(tmp_path, 'test')
  (tmp_path / 'test.csv').write_text(header + 'v0,a.mp4,a.wav,a dog\nv0,b.mp4,b.wav,a cat\n')
  with pytest.raises(ValueError, match="line 3: video_id 'v0' again .first on line 2"):
    _open(tmp_path, 'test')
  with pytest.raises(ValueError, match="smit: no split 'dev'"):
    smit_builder.read_rows(tmp_path, 'dev')


def test_paper_configs_point_at_the_layout():
  for get_config in (smit_language_amm.get_config, smit_spoken_amm.get_config):
    p1, p2 = get_config(), get_config('phase2')
    assert p1.features_source.name == p2.dataset.name == 'smit'
    assert p1.features_source.path is None and p2.dataset.path is None
  assert smit_language_amm.get_config('phase2').dataset.spoken is False
  assert smit_spoken_amm.get_config('phase2').dataset.spoken is True


@pytest.mark.parametrize("caption", ["language", pytest.param("spoken", marks=pytest.mark.slow)])
def test_smit_features_from_the_layout(smit, tmp_path, caption):
  """Phase 1's features from real-layout files: the language config opens no caption
  audio and writes words only; the spoken one writes the log-mel of each caption."""
  import h5py  # pylint: disable=g-import-not-at-top
  from avtext.data import audio  # pylint: disable=g-import-not-at-top
  from avtext.features import smit as smit_features  # pylint: disable=g-import-not-at-top
  module = {'language': smit_language_amm, 'spoken': smit_spoken_amm}[caption]
  config = module.get_config('tiny')
  config.features_source = ml_collections.ConfigDict(dict(
      name='smit', path=str(smit.root), spoken=caption == 'spoken', progress=False))
  out = smit_features.extract(config, tmp_path / 'f', splits=('test',), batch_size=4)
  with h5py.File(out / 'test.h5') as f:
    assert [x.decode() for x in f['ids'][()]] == [f'test{i:05d}' for i in range(4)]
    assert ('words' in f) == (caption == 'language')
    assert ('log_mel' in f) == (caption == 'spoken')
    if caption == 'spoken':
      ref = datasets.SyntheticSpokenClips('test', num_examples=SIZES['test'], spec=SPEC)
      off = f['log_mel_offsets'][()]
      for i in (0, 3):
        want = audio.log_mel_spectrogram(ref.render_speech(i), num_mel_bins=40)
        got = f['log_mel'][off[i]:off[i + 1]].astype(np.float32)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=0.05)  # float16 storage, 16-bit wav
