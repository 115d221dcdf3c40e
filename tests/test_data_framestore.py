"""The per-frame store (`materialize --format=frames_*`, read as `frames:<name>`): a
training read samples the frame indices the mp4 path samples and decodes those frames
only; pixels checked against the mp4 decoded directly by PyAV here."""
import concurrent.futures
import json

import ml_collections
import numpy as np
import pytest

from avtext.data import builders
from avtext.data import clip_export
from avtext.data import framestore
from avtext.data import pipelines
from avtext.data import video_io
from configs import videocc_avr

FPS, SECONDS, HEIGHT, WIDTH, SR = 25, 3.0, 64, 96, 16000
NUM_CLIPS = 3
# JPEG at quality 95 (4:4:4) of the textured frames below against PyAV's decode of the
# mp4: measured 39.9-41.1 dB per frame, mean 40.6 (quality 90: 36.4-38.2); the bound
# leaves ~2 dB.
JPEG_MIN_PSNR_DB = 38.0


def _frames(k: int) -> np.ndarray:
  """uint8 [T, H, W, 3]: moving gradients, a moving square and fixed noise -- texture a
  JPEG must spend bits on (flat frames would pass any PSNR bound)."""
  rng = np.random.default_rng(k)
  t = np.arange(int(FPS * SECONDS))[:, None, None]
  y, x = np.mgrid[:HEIGHT, :WIDTH]
  out = np.stack([128 + 100 * np.sin((x + 3 * t) / 9.0 + k),
                  128 + 100 * np.cos((y - 2 * t) / 7.0),
                  128 + 60 * np.sin((x + y + t) / 5.0)], -1)
  square = (np.abs(x - (10 + 2 * t)) < 8) & (np.abs(y - 30) < 8)
  out = np.where(square[..., None], [250, 20, 40], out) + rng.normal(0, 6, (1, HEIGHT, WIDTH, 3))
  return np.clip(out, 0, 255).astype(np.uint8)


@pytest.fixture(scope='module')
def clips_dir(tmp_path_factory):
  """The videocc3m layout: NUM_CLIPS whole-file clips with a tone as audio."""
  root = tmp_path_factory.mktemp('videocc3m')
  (root / 'videos').mkdir()
  rows = []
  for k in range(NUM_CLIPS):
    tone = 0.3 * np.sin(2 * np.pi * (220 + 110 * k) * np.arange(int(SR * SECONDS)) / SR)
    video_io.write_video(root / 'videos' / f'v{k}.mp4', _frames(k), FPS, audio=tone)
    rows.append(f'v{k},0,{int(SECONDS * 1e6)},clip number {k}\n')
  (root / 'video_cc_public.csv').write_text(''.join(rows))
  return root


def _mp4_config(clips_dir):
  return ml_collections.ConfigDict({'name': 'videocc3m', 'path': str(clips_dir),
                                    'progress': False})


@pytest.fixture(scope='module')
def stores(clips_dir, tmp_path_factory):
  data_dir = tmp_path_factory.mktemp('stores')
  for fmt in framestore.FORMATS:
    summary = clip_export.materialize(_mp4_config(clips_dir), ['train'], name=fmt,
                                      data_dir=data_dir, fmt=fmt, workers=2)
    assert summary == {'train': {'records': NUM_CLIPS, 'skipped': {}}}
  return data_dir


def _open(stores, fmt):
  return builders.get_source(ml_collections.ConfigDict(
      {'name': f'frames:{fmt}', 'data_dir': str(stores)}), 'train')


def _pyav_frames(path) -> np.ndarray:
  """Every frame of the file, decoded here with PyAV (not through avtext)."""
  import av  # pylint: disable=g-import-not-at-top
  with av.open(str(path)) as container:
    return np.stack([f.to_ndarray(format='rgb24') for f in container.decode(video=0)])


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
  mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
  return float('inf') if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def _examples(source):
  data = videocc_avr.get_config('tiny').data
  data.num_frames, data.frame_stride = 8, 5  # 36 of the 75 frames: a random offset
  return pipelines.ClipExamples(pipelines.ClipReader(source), data, train=True)


def _train_read(examples, index, seed):
  """What a training example reads: the sampler's indices, the frames, the audio windows."""
  rng = np.random.default_rng(seed)
  return examples.reader.read(index, examples._frame_indices(rng),  # pylint: disable=protected-access
                              examples._audio_windows, examples.modalities)  # pylint: disable=protected-access


@pytest.mark.parametrize('fmt', framestore.FORMATS)
def test_store_samples_the_mp4s_frames(clips_dir, stores, fmt):
  mp4 = _examples(builders.get_source(_mp4_config(clips_dir), 'train'))
  stored = _examples(_open(stores, fmt))
  offsets = set()
  for index in range(NUM_CLIPS):
    truth = _pyav_frames(clips_dir / 'videos' / f'v{index}.mp4')
    assert truth.shape == (75, HEIGHT, WIDTH, 3)
    for seed in (0, 1, 2):
      a, b = _train_read(mp4, index, seed), _train_read(stored, index, seed)
      idx = b['frame_indices'][0]
      np.testing.assert_array_equal(a['frame_indices'], b['frame_indices'])
      np.testing.assert_array_equal(np.diff(idx), 5)
      offsets.add(int(idx[0]))
      np.testing.assert_array_equal(a['frames'][0], truth[idx])  # the mp4 path's own pixels
      if fmt == 'frames_jpeg':
        psnrs = [_psnr(f, t) for f, t in zip(b['frames'][0], truth[idx])]
        assert min(psnrs) >= JPEG_MIN_PSNR_DB, psnrs
      else:
        np.testing.assert_array_equal(b['frames'][0], truth[idx])
      for wa, wb in zip(a['audio'], b['audio']):
        np.testing.assert_array_equal(wa, wb)
      assert (a['caption'], a['has_audio']) == (b['caption'], b['has_audio']) == (
          f'clip number {index}', True)
  assert len(offsets) > 1  # the seeds moved the segment


def test_lossless_store_gives_the_mp4s_training_examples(clips_dir, stores):
  mp4 = _examples(builders.get_source(_mp4_config(clips_dir), 'train'))
  stored = _examples(_open(stores, 'frames_png'))
  for index, seed in ((0, 3), (2, 4)):
    a = mp4(index, np.random.default_rng(seed))
    b = stored(index, np.random.default_rng(seed))
    assert a.keys() == b.keys()
    for key in a:
      np.testing.assert_array_equal(a[key], b[key])


def test_store_reads_only_the_sampled_frames(stores, monkeypatch):
  source = _open(stores, 'frames_jpeg')
  decoded = []
  real = framestore.decode_frame
  monkeypatch.setattr(framestore, 'decode_frame',
                      lambda *a: decoded.append(a[0]) or real(*a))
  frames = source.render_frames(1, [40, 3, 3, 74])
  assert frames.shape == (4, HEIGHT, WIDTH, 3) and len(decoded) == 3  # 3 distinct frames
  np.testing.assert_array_equal(frames[1], frames[2])
  with pytest.raises(IndexError, match='has 75 frames, asked for 3..75'):
    source.render_frames(1, [3, 75])


def test_whole_clips_and_layout(clips_dir, stores):
  lazy = builders.get_source(_mp4_config(clips_dir), 'train')
  raw = _open(stores, 'frames_raw')
  assert len(raw) == NUM_CLIPS and raw.describe(2)['num_frames'] == 75
  a, b = lazy[2], raw[2]
  np.testing.assert_array_equal(a['frames'], b['frames'])
  np.testing.assert_array_equal(a['audio'], b['audio'])
  assert len(b['audio']) == SR * SECONDS and b['video_id'] == 'v2'
  np.testing.assert_array_equal(raw.render_audio(2, 15990, 30), a['audio'][15990:16020])
  np.testing.assert_array_equal(raw.render_audio(2, len(a['audio']) - 5, 10)[5:], 0)
  # grain reads with threads: concurrent reads give what sequential ones do.
  asks = [(i % NUM_CLIPS, np.arange(i, 75, 7)) for i in range(12)]
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    got = list(pool.map(lambda a: raw.render_frames(*a), asks))
  for (i, idx), frames in zip(asks, got):
    np.testing.assert_array_equal(frames, raw.render_frames(i, idx))
  info = json.loads((stores / 'frames_jpeg' / 'train' / 'info.json').read_text())
  assert (info['format'], info['quality'], info['clips'], info['frames']) == (
      'frames_jpeg', 95, NUM_CLIPS, NUM_CLIPS * 75)
  assert not list(stores.glob('*/*.incomplete'))


def test_errors_name_the_fix(stores, tmp_path):
  with pytest.raises(FileNotFoundError, match=r"stored splits: \['train'\].*--splits=test"):
    builders.get_source(ml_collections.ConfigDict(
        {'name': 'frames:frames_jpeg', 'data_dir': str(stores)}), 'test')
  with pytest.raises(ValueError, match=r"'frames:x' needs config.dataset.data_dir"):
    builders.get_source(ml_collections.ConfigDict({'name': 'frames:x'}), 'train')
  with pytest.raises(ValueError, match='--format=frames_gif: not a format'):
    clip_export.materialize(ml_collections.ConfigDict({'name': 'x'}), ['train'], name='x',
                            data_dir=tmp_path, fmt='frames_gif')


def test_audio_dataset_stores_no_frames(tmp_path):
  from avworld import layouts  # pylint: disable=g-import-not-at-top
  from avworld import world  # pylint: disable=g-import-not-at-top
  w = layouts.write('clotho', tmp_path / 'clotho', sizes={'train': 1, 'val': 1, 'test': 1},
                    spec=world.WorldSpec(height=32, width=32, duration_s=2.0), progress=False)
  ds = ml_collections.ConfigDict({'name': 'clotho', 'path': str(w.root), 'progress': False})
  clip_export.materialize(ds, ['test'], name='clotho', data_dir=tmp_path, fmt='frames_jpeg')
  lazy = builders.get_source(ds, 'test')
  stored = builders.get_source(ml_collections.ConfigDict(
      {'name': 'frames:clotho', 'data_dir': str(tmp_path)}), 'test')
  assert len(stored) == len(lazy) == 5  # five captions of one file
  assert stored.describe(0)['num_frames'] == lazy.describe(0)['num_frames'] == 50
  np.testing.assert_array_equal(stored[3]['audio'], lazy[3]['audio'])
  assert 'frames' not in stored[3]
  with pytest.raises(ValueError, match='stores no frames'):
    stored.render_frames(0, [0])


def test_shards_roll_at_clip_boundaries(tmp_path):
  rng = np.random.default_rng(0)
  clips = [{'frames': rng.integers(0, 256, (n, 8, 10, 3), np.uint8),
            'audio': rng.normal(size=1600 * n).astype(np.float32), 'has_audio': True,
            'caption': f'c{n}', 'clip_id': f'{n}', 'video_id': f'v{n}'} for n in (3, 1, 4)]
  # shard_bytes=1: every clip starts a shard; 1 kHz: 1000-sample audio records.
  assert framestore.write(tmp_path, 'train', iter(clips), fmt='frames_raw', sample_rate=1000,
                          shard_bytes=1) == 3
  assert sorted(p.name for p in (tmp_path / 'train').glob('frames.*')) == [
      f'frames.array_record-{i:05d}-of-00003' for i in range(3)]
  source = framestore.FrameClips(tmp_path, 'train')
  for i, clip in enumerate(clips):
    np.testing.assert_array_equal(source.render_frames(i, [len(clip['frames']) - 1, 0]),
                                  clip['frames'][[-1, 0]])
    np.testing.assert_array_equal(source.render_audio(i), clip['audio'])
    window = source.render_audio(i, 990, 1020)  # across records; zeros past the end
    want = clip['audio'][990:2010]
    np.testing.assert_array_equal(window[:len(want)], want)
    assert not window[len(want):].any()
