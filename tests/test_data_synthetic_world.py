"""Facts about the synthetic world and its clip-caption source.

Reference values here are computed independently of the implementation: the
object trajectories from the stored nuisance parameters with a hand-written
direction table, audio facts with numpy FFTs, the oracle with a brute-force
loop over all caption-clip pairs.
"""
import collections
import hashlib
import itertools
import json
import pickle
import re
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from avworld import captions
from avworld import clips
from avworld import world

SPEC = world.WorldSpec()
# Image coordinates: x grows to the right, y grows downwards.
DIRECTIONS = {'still': (0, 0), 'left': (-1, 0), 'right': (1, 0),
              'up': (0, -1), 'down': (0, 1)}


@pytest.fixture(scope='module')
def train_described():
  source = clips.ClipCaptionSource('train')
  return [source.describe(i) for i in range(3000)]


def _example_digest(example):
  h = hashlib.sha256()
  h.update(example['frames'].tobytes())
  h.update(example['audio'].tobytes())
  h.update(example['caption'].encode())
  h.update(json.dumps(example['attributes'], sort_keys=True).encode())
  h.update(example['clip_id'].encode())
  return h.hexdigest()


def _assert_same_example(a, b):
  assert a.keys() == b.keys()
  for key in a:
    if isinstance(a[key], np.ndarray):
      assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape
      assert a[key].tobytes() == b[key].tobytes(), key
    else:
      assert a[key] == b[key], key


# ------------------------------------------------------------ example format
def test_example_format():
  source = clips.ClipCaptionSource('test')
  assert len(source) == 1000
  assert len(clips.ClipCaptionSource('val')) == 1000
  assert len(clips.ClipCaptionSource('train')) == 100_000
  ex = source[7]
  assert ex['frames'].dtype == np.uint8
  assert ex['frames'].shape == (250, 64, 64, 3)
  assert ex['audio'].dtype == np.float32 and ex['audio'].shape == (160_000,)
  assert np.abs(ex['audio']).max() <= 1.0
  assert ex['has_audio'] is True
  assert isinstance(ex['caption'], str) and ex['caption']
  assert ex['mentions_sound'] == ('sound' in ex['attributes']['mentioned'])
  json.dumps(ex['attributes'])  # JSON-serializable
  with pytest.raises(IndexError):
    source[1000]
  with pytest.raises(ValueError, match='unknown split'):
    clips.ClipCaptionSource('validation')


def test_vocabulary_and_reachable_combinations(train_described):
  assert len(world.SHAPES) >= 4 and len(world.COLOURS) >= 6
  assert len(world.MOTIONS) >= 5 and 'still' in world.MOTIONS
  assert len(world.BACKGROUNDS) >= 4
  assert len(world.SOUNDS) >= 5 and 'silence' in world.SOUNDS
  combos = set()
  for d in train_described:
    a = d['attributes']
    objects = tuple(sorted((o['shape'], o['colour'], o['motion'])
                           for o in a['objects']))
    combos.add((objects, a['background'], a['sound']))
    assert a['num_objects'] == len(a['objects']) in (1, 2)
  assert len(combos) >= 1000


# ------------------------------------------------------------ determinism
def test_reaccess_and_pickle_are_bitwise_identical():
  source = clips.ClipCaptionSource('val', seed=3)
  first = [source[i] for i in (0, 5, 999)]
  source.describe(17)  # interleaved access must not matter
  clone = pickle.loads(pickle.dumps(source))
  fresh = clips.ClipCaptionSource('val', seed=3)
  for k, i in enumerate((0, 5, 999)):
    _assert_same_example(first[k], source[i])
    _assert_same_example(first[k], clone[i])
    _assert_same_example(first[k], fresh[i])
  other_seed = clips.ClipCaptionSource('val', seed=4)[0]
  assert _example_digest(other_seed) != _example_digest(first[0])


def test_identical_bytes_in_another_process():
  source = clips.ClipCaptionSource('test')
  expected = [_example_digest(source[i]) for i in (0, 421)]
  code = (
      'import sys; sys.path.insert(0, "tests")\n'
      'from test_data_synthetic_world import _example_digest\n'
      'from avworld import clips\n'
      's = clips.ClipCaptionSource("test")\n'
      'print(" ".join(_example_digest(s[i]) for i in (0, 421)))\n')
  out = subprocess.run([sys.executable, '-c', code], capture_output=True,
                       text=True, check=True)
  assert out.stdout.split() == expected


def test_partial_rendering_equals_full_rendering():
  source = clips.ClipCaptionSource('train')
  rng = np.random.default_rng(0)
  for i in (0, 1, 2, 3, 99_999):
    full = source[i]
    idx = np.sort(rng.choice(SPEC.num_frames, size=8, replace=False))
    assert source.render_frames(i, idx).tobytes() == full['frames'][
        idx].tobytes()
    assert source.render_frames(i, [249, 0]).tobytes() == full['frames'][
        [249, 0]].tobytes()
    for start, num in ((0, 40_000), (1, 1), (12_345, 40_000), (1023, 1025),
                       (159_999, 1), (150_000, 20_000), (60_000, None)):
      part = source.render_audio(i, start, num)
      want = full['audio'][start:None if num is None else start + num]
      assert part.dtype == np.float32
      assert part.tobytes() == want.tobytes(), (i, start, num)
    described = source.describe(i)
    for key in ('caption', 'attributes', 'clip_id', 'mentions_sound'):
      assert described[key] == full[key]
    assert described['num_frames'] == 250
    assert described['num_samples'] == 160_000


# ------------------------------------------------------------ splits
def test_splits_are_disjoint():
  fingerprints, ids = {}, {}
  for split, n in (('train', 3000), ('val', 1000), ('test', 1000)):
    source = clips.ClipCaptionSource(split)
    fingerprints[split] = {source.scene(i).fingerprint() for i in range(n)}
    ids[split] = {source.clip_id(i) for i in range(n)}
    assert len(fingerprints[split]) == n  # no repeats inside a split either
    assert len(ids[split]) == n
  for a, b in itertools.combinations(fingerprints, 2):
    assert not fingerprints[a] & fingerprints[b], (a, b)
    assert not ids[a] & ids[b], (a, b)


def test_example_stream_depends_only_on_seed_stream_index():
  a = world.example_rng(0, 'clips/test', 5)
  b = world.example_rng(0, 'clips/test', 5)
  assert a.visual.random() == b.visual.random()
  assert (world.example_rng(0, 'clips/val', 5).visual.random() !=
          world.example_rng(0, 'clips/test', 5).visual.random())


# ------------------------------------------------------------ independence
def test_sound_is_independent_of_visual_attributes(train_described):
  attrs = [d['attributes'] for d in train_described]
  sounds = [a['sound'] for a in attrs]
  visual_factors = {
      'background': [a['background'] for a in attrs],
      'num_objects': [a['num_objects'] for a in attrs],
      'colour': [a['objects'][0]['colour'] for a in attrs],
      'shape': [a['objects'][0]['shape'] for a in attrs],
      'motion': [a['objects'][0]['motion'] for a in attrs],
  }
  for name, values in visual_factors.items():
    table = collections.Counter(zip(sounds, values))
    rows, cols = sorted(set(sounds)), sorted(set(values))
    counts = np.array([[table[r, c] for c in cols] for r in rows])
    p_value = stats.chi2_contingency(counts).pvalue
    assert p_value > 1e-3, (name, counts)
  # Every sound occurs with every background: sound is not predictable.
  assert len(set(zip(sounds, visual_factors['background']))) == 20


# ------------------------------------------------------------ captions
def _phrase_values(caption, words):
  """Values whose synonyms appear in the caption as whole phrases."""
  return {value for value, synonyms in words.items()
          if any(re.search(rf'\b{re.escape(s)}\b', caption, re.IGNORECASE)
                 for s in synonyms)}


def test_caption_statistics(train_described):
  n = len(train_described)
  sound_rate = np.mean([d['mentions_sound'] for d in train_described])
  assert 0.37 < sound_rate < 0.43  # ~40 %; binomial sd is 0.9 %
  statements = [captions.num_statements(d['attributes']['mentioned'])
                for d in train_described]
  assert min(statements) >= 2
  templates = collections.Counter(d['attributes']['template']
                                  for d in train_described)
  assert len(templates) >= 5 and min(templates.values()) > n / 20
  assert len({d['caption'] for d in train_described}) > 0.9 * n


def _mention_digest(**kwargs):
  """sha256 of 500 mentions of random scenes, each followed by the stream's next integer
  (so a change in how many numbers a draw consumes changes the digest)."""
  h = hashlib.sha256()
  rng = np.random.default_rng(2026)
  for _ in range(500):
    attributes = world.sample_scene(rng, rng, world.WorldSpec()).attributes()
    mention = captions.sample_mention(rng, attributes, **kwargs)
    h.update(json.dumps(mention, sort_keys=True).encode())
    h.update(str(rng.integers(1 << 30)).encode())
  return h.hexdigest()


def test_sample_mention_default_draws_as_before_object_fields():
  # Recorded from `sample_mention` before it took `object_fields`: the clip, multi-scene
  # and long-video worlds draw their captions through the default path, bit for bit.
  before = '93b68973b5a7d50b09bcdef12307a9e12c3fdeba967a2bc79af44049e331a83b'
  assert _mention_digest() == before
  assert _mention_digest(object_fields=world.OBJECT_FIELDS) == before
  assert _mention_digest(object_fields=('shape', 'colour')) != before


def test_sample_mention_states_only_the_object_fields_asked_for():
  rng = np.random.default_rng(3)
  stated = collections.Counter()
  for _ in range(400):
    attributes = world.sample_scene(rng, rng, SPEC).attributes()
    mention = captions.sample_mention(rng, attributes, sound_rate=0.0,
                                      object_fields=('shape', 'colour'))
    assert captions.num_statements(mention) >= 2
    assert captions.caption_fits(mention, attributes)
    assert 'sound' not in mention
    for desc in mention['objects']:
      assert desc and set(desc) <= {'shape', 'colour'}, mention
      stated.update(desc.keys())
    stated.update(k for k in ('num_objects', 'background') if k in mention)
  assert set(stated) == {'shape', 'colour', 'num_objects', 'background'}
  attributes = world.sample_scene(rng, rng, SPEC).attributes()
  for bad in ((), ('shape', 'size'), ('shape', 'shape')):
    with pytest.raises(ValueError, match='object_fields'):
      captions.sample_mention(rng, attributes, object_fields=bad)


def test_captions_say_exactly_the_mentioned_attributes(train_described):
  categories = {'shape': captions.SHAPE_WORDS,
                'colour': captions.COLOUR_WORDS,
                'motion': captions.MOTION_WORDS,
                'background': captions.BACKGROUND_WORDS,
                'sound': captions.SOUND_WORDS}
  for d in train_described[:1500]:
    mention, text = d['attributes']['mentioned'], d['caption']
    for field, words in categories.items():
      if field in ('background', 'sound'):
        said = {mention[field]} if field in mention else set()
      else:
        said = {o[field] for o in mention['objects'] if field in o}
      assert _phrase_values(text, words) == said, (text, mention, field)
    count_words = re.search(r'\b(two|pair|single|one)\b', text, re.I)
    assert (count_words is not None) == ('num_objects' in mention), text
    # The stated facts are true of the clip the caption belongs to.
    assert captions.caption_fits(mention, d['attributes'])


def test_caption_fits_hand_made_cases():
  clip = {'num_objects': 2, 'background': 'striped', 'sound': 'tone',
          'objects': [{'shape': 'circle', 'colour': 'red', 'motion': 'still'},
                      {'shape': 'square', 'colour': 'blue',
                       'motion': 'left'}]}
  fits = captions.caption_fits
  assert fits({'objects': [{'colour': 'red'}], 'sound': 'tone'}, clip)
  assert fits({'objects': [{'colour': 'blue', 'motion': 'left'},
                           {'shape': 'circle'}]}, clip)
  assert fits({'num_objects': 2, 'objects': []}, clip)
  # Object-level statements bind to one object: red is still, not moving left.
  assert not fits({'objects': [{'colour': 'red', 'motion': 'left'}]}, clip)
  # Two descriptions need two distinct objects.
  assert not fits({'objects': [{'shape': 'circle'}, {'colour': 'red'}]}, clip)
  assert not fits({'num_objects': 1, 'objects': [{'colour': 'red'}]}, clip)
  assert not fits({'objects': [], 'sound': 'silence',
                   'background': 'striped'}, clip)
  assert not fits({'objects': [{'shape': 'cross'}],
                   'background': 'striped'}, clip)
  single = {'num_objects': 1, 'background': 'plain', 'sound': 'drum',
            'objects': [{'shape': 'circle', 'colour': 'red',
                         'motion': 'still'}]}
  assert not fits({'objects': [{'colour': 'red'}, {'colour': 'blue'}]},
                  single)


# ------------------------------------------------------------ oracle
def test_oracle_matches_brute_force_loop():
  source = clips.ClipCaptionSource('test', num_examples=150)
  attrs = [source.describe(i)['attributes'] for i in range(150)]
  brute = np.zeros(150, dtype=int)
  for c in range(150):
    for v in range(150):
      # Re-derive the binding rule here with explicit loops.
      cap, clip = attrs[c]['mentioned'], attrs[v]
      ok = all(cap[k] == clip[k] for k in ('num_objects', 'background',
                                           'sound') if k in cap)
      descs = cap['objects']
      if ok:
        ok = False
        for perm in itertools.permutations(range(clip['num_objects']),
                                           len(descs)):
          if all(clip['objects'][j][f] == val
                 for d, j in zip(descs, perm) for f, val in d.items()):
            ok = True
      brute[c] += ok
  np.testing.assert_array_equal(source.num_fitting_clips(), brute)
  assert brute.min() >= 1  # every caption fits its own clip
  assert source.oracle_recall_at_1() == pytest.approx(
      100 * np.mean(1 / brute))
  sound = [i for i in range(150) if 'sound' in attrs[i]['mentioned']]
  assert source.oracle_recall_at_1(sound) == pytest.approx(
      100 * np.mean(1 / brute[sound]))
  assert clips.oracle_recall_at_1('test', num_examples=150) == pytest.approx(
      source.oracle_recall_at_1())


def test_oracle_hand_made():
  red = {'shape': 'circle', 'colour': 'red', 'motion': 'still'}
  blue = {'shape': 'circle', 'colour': 'blue', 'motion': 'still'}
  clip_attrs = [
      {'num_objects': 1, 'objects': [red], 'background': 'plain',
       'sound': 'tone'},
      {'num_objects': 1, 'objects': [blue], 'background': 'plain',
       'sound': 'tone'},
      {'num_objects': 2, 'objects': [red, blue], 'background': 'plain',
       'sound': 'drum'},
  ]
  mentions = [
      {'objects': [{'colour': 'red'}], 'sound': 'tone'},  # clip 0 only
      {'objects': [{'colour': 'blue'}]},  # clips 1 and 2
      {'objects': [{'shape': 'circle'}], 'background': 'plain'},  # all 3
  ]
  counts = captions.num_fitting_clips(mentions, clip_attrs)
  np.testing.assert_array_equal(counts, [1, 2, 3])
  assert captions.oracle_recall_at_1(counts) == pytest.approx(
      100 * (1 + 1 / 2 + 1 / 3) / 3)


# ------------------------------------------------------------ frames
def _centre(nuisance_obj, motion, t):
  dx, dy = DIRECTIONS[motion]
  return ((nuisance_obj['x0'] + dx * nuisance_obj['speed'] * t) % SPEC.width,
          (nuisance_obj['y0'] + dy * nuisance_obj['speed'] * t) % SPEC.height)


def test_object_centre_has_object_colour():
  source = clips.ClipCaptionSource('val')
  frame_idx = [0, 37, 125, 249]
  for i in range(60):
    attrs = source.describe(i)['attributes']
    frames = source.render_frames(i, frame_idx)
    top = attrs['objects'][-1]  # drawn last
    for k, f in enumerate(frame_idx):
      x, y = _centre(attrs['nuisance']['objects'][-1], top['motion'],
                     f / SPEC.fps)
      assert tuple(frames[k, int(y), int(x)]) == world.COLOURS[top['colour']]


def _colour_mask(frames, colour):
  return np.all(frames == np.array(world.COLOURS[colour], np.uint8), axis=-1)


def _circular_mean(mask, axis, size):
  coords = np.arange(size) + 0.5
  weights = mask.sum(axis=axis)
  angle = 2 * np.pi * coords / size
  mean = np.arctan2((weights * np.sin(angle)).sum(),
                    (weights * np.cos(angle)).sum())
  return (mean % (2 * np.pi)) * size / (2 * np.pi)


def test_motion_directions_and_still_objects():
  source = clips.ClipCaptionSource('train')
  seen = collections.Counter()
  for i in range(400):
    attrs = source.describe(i)['attributes']
    if attrs['num_objects'] != 1:
      continue
    obj, nuis = attrs['objects'][0], attrs['nuisance']['objects'][0]
    seen[obj['motion']] += 1
    frames = source.render_frames(i, [0, 25, 50])  # 1 s apart
    masks = [_colour_mask(f, obj['colour']) for f in frames]
    if obj['motion'] == 'still':
      assert masks[0].any()
      assert all(np.array_equal(masks[0], m) for m in masks[1:])
      continue
    xs = [_circular_mean(m, 0, SPEC.width) for m in masks]
    ys = [_circular_mean(m, 1, SPEC.height) for m in masks]
    dx, dy = DIRECTIONS[obj['motion']]
    for a, b in ((0, 1), (1, 2)):
      # Displacement on the torus, in (-size/2, size/2].
      step_x = (xs[b] - xs[a] + SPEC.width / 2) % SPEC.width - SPEC.width / 2
      step_y = (ys[b] - ys[a] + SPEC.height / 2) % SPEC.height - (
          SPEC.height / 2)
      # Centroids of pixelated shapes are within ~0.5 px of the true centre.
      assert step_x == pytest.approx(dx * nuis['speed'], abs=1.0)
      assert step_y == pytest.approx(dy * nuis['speed'], abs=1.0)
      if obj['motion'] == 'left':
        assert step_x < -7  # at least 8 px/s at 64x64
  assert min(seen.values()) >= 20


def test_shapes_fill_their_bounding_boxes_as_expected():
  # Area / bounding-box area of the continuous shapes: square 1, circle
  # pi/4, triangle 1/2, cross 5/9.
  expected = {'square': 1.0, 'circle': np.pi / 4, 'triangle': 0.5,
              'cross': 5 / 9}
  source = clips.ClipCaptionSource('test')
  for i in range(200):
    attrs = source.describe(i)['attributes']
    if attrs['num_objects'] != 1:
      continue
    obj = attrs['objects'][0]
    mask = _colour_mask(source.render_frames(i, [0])[0], obj['colour'])
    rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
    box = (rows[-1] - rows[0] + 1) * (cols[-1] - cols[0] + 1)
    assert mask.sum() / box == pytest.approx(expected[obj['shape']], abs=0.09)
    size = attrs['nuisance']['objects'][0]['size']
    assert 12 <= size <= 24  # objects are 12-24 px across at 64x64


def test_background_is_grey_and_low_contrast():
  source = clips.ClipCaptionSource('test')
  for i in range(30):
    attrs = source.describe(i)['attributes']
    frame = source.render_frames(i, [0])[0].astype(int)
    grey = (frame[..., 0] == frame[..., 1]) & (frame[..., 1] == frame[..., 2])
    objects = np.zeros(grey.shape, bool)
    for o in attrs['objects']:
      objects |= _colour_mask(frame, o['colour'])
    assert np.array_equal(grey, ~objects)  # every non-object pixel is grey
    bg = attrs['nuisance']['background']
    values = frame[grey, 0]
    assert values.min() >= bg['level'] - bg['contrast'] - 1
    assert values.max() <= bg['level'] + bg['contrast'] + 1
    if attrs['background'] == 'plain':
      assert values.min() == values.max()
    else:
      assert values.max() - values.min() >= bg['contrast']


# ------------------------------------------------------------ audio
def _sounds_by_kind(n):
  source = clips.ClipCaptionSource('test')
  by_kind = collections.defaultdict(list)
  for i in range(200):
    kind = source.describe(i)['attributes']['sound']
    if len(by_kind[kind]) < n:
      by_kind[kind].append(i)
  return source, by_kind


def _band_fraction(wave, low, high):
  power = np.abs(np.fft.rfft(wave)) ** 2
  freqs = np.fft.rfftfreq(len(wave), 1 / SPEC.sample_rate)
  return power[(freqs >= low) & (freqs < high)].sum() / power.sum()


def test_sound_types_have_their_spectra():
  source, by_kind = _sounds_by_kind(3)
  assert all(len(by_kind[k]) == 3 for k in world.SOUNDS)
  for kind, indices in by_kind.items():
    for i in indices:
      nuis = source.describe(i)['attributes']['nuisance']['sound']
      start = nuis['onset'] + 800  # past onset and fade-in
      num = 32_000
      if kind in ('chirp', 'noise', 'drum'):  # whole periods only
        period = nuis['period_s'] * SPEC.sample_rate
        num = int(round(period * (32_000 // period)))
      wave = source.render_audio(i, start, num).astype(np.float64)
      rms = np.sqrt(np.mean(wave ** 2))
      if kind == 'silence':
        assert np.abs(source.render_audio(i)).max() <= 1e-3
        assert rms < 1e-3
        continue
      assert rms > 0.02, kind  # >= 30 dB above the noise floor
      if kind == 'tone':
        spectrum = np.abs(np.fft.rfft(wave * np.hanning(len(wave))))
        peak = np.fft.rfftfreq(len(wave), 1 / SPEC.sample_rate)[
            spectrum.argmax()]
        assert peak == pytest.approx(nuis['freq'], abs=1.0)  # 0.5 Hz bins
      elif kind == 'chirp':
        low = min(nuis['freq'], nuis['freq_end'])
        high = max(nuis['freq'], nuis['freq_end'])
        assert _band_fraction(wave, low - 50, high + 50) > 0.95
        assert _band_fraction(wave, 1500, 8000) > 0.3
      elif kind == 'drum':
        assert _band_fraction(wave, 0, 300) > 0.9
      elif kind == 'noise':
        assert _band_fraction(wave, 4000, 8000) > 0.4  # broadband
        loud = np.abs(wave) > 0.01
        # Bursts: on for length_s of every period_s.
        assert loud.mean() == pytest.approx(
            nuis['length_s'] / nuis['period_s'], abs=0.08)
  for kind in ('tone', 'drum'):
    for i in by_kind[kind]:
      wave = source.render_audio(i, 8000, 32_000).astype(np.float64)
      assert _band_fraction(wave, 1500, 8000) < 0.01, kind
