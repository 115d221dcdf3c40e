"""Captions of synthetic scenes: which attributes to mention, how to say them,
and when a caption fits a clip.

A caption is generated in two steps. `sample_mention` picks the attribute
statements ("mentioned attributes", a JSON dict) from the scene's ground
truth; `render_caption` turns them into one of several sentence templates with
synonyms. Evaluation never parses text: it uses the stored mention dict and
`caption_fits`, which defines the retrieval oracle.

Mention dict (every key optional except 'objects'):
  {'num_objects': 2, 'background': 'striped', 'sound': 'tone',
   'objects': [{'colour': 'red', 'motion': 'left'}, {'shape': 'square'}]}
Each entry of 'objects' describes one object by a non-empty subset of
('shape', 'colour', 'motion').
"""
from __future__ import annotations

import itertools
import re
from typing import Any, Mapping, Sequence

import numpy as np

from avworld import world

SOUND_MENTION_RATE = 0.4
# Number of visual statements (count, background, object fields) in a
# caption, for captions without / with a sound statement. Captions say 2-5
# things in total, so many captions fit one or a few clips of a 1000-clip
# split while some stay ambiguous, which the oracle accounts for.
_VISUAL_STATEMENTS = {False: (2, 3, 4, 5), True: (1, 2, 3, 4)}

SHAPE_WORDS = {
    'circle': ('circle', 'disc', 'ball'),
    'square': ('square', 'box', 'block'),
    'triangle': ('triangle', 'triangular shape'),
    'cross': ('cross', 'plus sign'),
}
GENERIC_NOUNS = ('object', 'shape', 'thing')
COLOUR_WORDS = {
    'red': ('red', 'scarlet'),
    'green': ('green', 'emerald'),
    'blue': ('blue', 'deep blue'),
    'yellow': ('yellow', 'golden'),
    'purple': ('purple', 'violet'),
    'orange': ('orange', 'amber'),
}
MOTION_WORDS = {
    'still': ('standing still', 'not moving', 'staying in place', 'at rest'),
    'left': ('moving left', 'sliding to the left', 'drifting leftward',
             'heading left'),
    'right': ('moving right', 'sliding to the right', 'drifting rightward',
              'heading right'),
    'up': ('moving up', 'rising', 'drifting upward', 'floating up'),
    'down': ('moving down', 'falling', 'sinking', 'drifting downward'),
}
BACKGROUND_WORDS = {
    'plain': ('plain', 'uniform grey', 'solid grey', 'flat'),
    'striped': ('striped', 'stripy', 'lined'),
    'gradient': ('gradient', 'shaded', 'fading'),
    'checkered': ('checkered', 'checkerboard', 'chequered'),
}
SOUND_WORDS = {
    'silence': ('silence', 'no sound', 'complete silence'),
    'tone': ('a steady tone', 'a beep', 'a pure tone', 'a constant whistle'),
    'chirp': ('a chirp', 'a sweeping tone', 'a siren-like sweep',
              'repeated pitch sweeps'),
    'noise': ('bursts of noise', 'a hissing noise', 'static',
              'white noise bursts'),
    'drum': ('a drum beat', 'rhythmic thumps', 'a steady knocking',
             'periodic drum hits'),
}
# Templates are sequences of pieces; a piece naming a slot that the caption
# does not mention is dropped, so every template works for every mention set.
TEMPLATES: tuple[tuple[str, ...], ...] = (
    ('{objs}', ' on a {bg} background', ', with {snd}', '.'),
    ('The video shows {objs}', ' over a {bg} backdrop',
     '; the audio has {snd}', '.'),
    ('{snd} can be heard while ', '{objs} can be seen',
     ' on a {bg} background', '.'),
    ('A {bg} background behind ', '{objs}', ', accompanied by {snd}', '.'),
    ('Video of {objs}', ' against a {bg} background',
     ' with {snd} in the audio', '.'),
    ('We see {objs}', ' on a {bg} background', ' and hear {snd}', '.'),
    ('Against a {bg} backdrop, ', '{objs}', '. Sound: {snd}', '.'),
)
_SLOT = re.compile(r'\{(\w+)\}')


def _pick(rng: np.random.Generator, options: Sequence[str]) -> str:
  return options[rng.integers(len(options))]


def num_statements(mention: Mapping[str, Any]) -> int:
  """How many attribute statements a mention dict makes."""
  scene_level = sum(k in mention for k in ('num_objects', 'background',
                                           'sound'))
  return scene_level + sum(len(d) for d in mention.get('objects', ()))


def sample_mention(rng: np.random.Generator, attributes: Mapping[str, Any], *,
                   sound_rate: float = SOUND_MENTION_RATE,
                   object_fields: Sequence[str] = world.OBJECT_FIELDS) -> dict[str, Any]:
  """A random subset (>= 2 statements) of the scene's attributes.

  The sound is mentioned with probability `sound_rate` (SOUND_MENTION_RATE; 0 for
  an image's caption, which cannot say what is heard), independently of
  everything else; the visual statements are a uniform random subset of the
  count, the background and the objects' `object_fields` (all of
  world.OBJECT_FIELDS by default; an image's caption leaves out 'motion', which
  a still does not show). The default draws exactly as before the option.
  """
  unknown = [f for f in object_fields if f not in world.OBJECT_FIELDS]
  if not object_fields or unknown or len(set(object_fields)) != len(object_fields):
    raise ValueError(f'object_fields: expected distinct fields of {world.OBJECT_FIELDS}, '
                     f'got {tuple(object_fields)}')
  mention_sound = bool(rng.random() < sound_rate)
  atoms = [('num_objects',), ('background',)] + [
      ('object', j, field) for j in range(attributes['num_objects'])
      for field in object_fields]
  choices = [k for k in _VISUAL_STATEMENTS[mention_sound] if k <= len(atoms)]
  k = choices[rng.integers(len(choices))]
  mention: dict[str, Any] = {}
  descs: dict[int, dict[str, str]] = {}
  for a in sorted(rng.choice(len(atoms), size=k, replace=False)):
    atom = atoms[a]
    if atom[0] == 'object':
      _, j, field = atom
      descs.setdefault(j, {})[field] = attributes['objects'][j][field]
    else:
      mention[atom[0]] = attributes[atom[0]]
  if mention_sound:
    mention['sound'] = attributes['sound']
  # Caption order of objects is random; binding to clip objects is order-free.
  order = rng.permutation(sorted(descs))
  mention['objects'] = [descs[j] for j in order]
  return mention


def with_article(phrase: str) -> str:
  return ('an ' if phrase[0] in 'aeiou' else 'a ') + phrase


def object_phrase(rng: np.random.Generator, desc: Mapping[str, str]) -> str:
  """Noun phrase without determiner, e.g. 'scarlet disc sliding to the left'."""
  noun = _pick(rng, SHAPE_WORDS[desc['shape']] if 'shape' in desc else
               GENERIC_NOUNS)
  if 'colour' in desc:
    noun = f"{_pick(rng, COLOUR_WORDS[desc['colour']])} {noun}"
  if 'motion' in desc:
    noun = f"{noun} {_pick(rng, MOTION_WORDS[desc['motion']])}"
  return noun


def objects_phrase(rng: np.random.Generator, mention: Mapping[str, Any]
                   ) -> str:
  """The mention's count and objects as one noun phrase ('two shapes: a red disc and ...')."""
  descs = mention['objects']
  nps = [with_article(object_phrase(rng, d)) for d in descs]
  count = mention.get('num_objects')
  if count == 1:
    single = object_phrase(rng, descs[0] if descs else {})
    return f"{_pick(rng, ('a single', 'one', 'only one'))} {single}"
  if count == 2:
    group = _pick(rng, ('two objects', 'two shapes', 'a pair of shapes'))
    if len(nps) == 2:
      return f'{group}: {nps[0]} and {nps[1]}'
    if len(nps) == 1:
      return f"{group}, {_pick(rng, ('one of them', 'including'))} {nps[0]}"
    return group
  if count is not None:
    raise ValueError(f'num_objects must be 1 or {world.MAX_OBJECTS} in a '
                     f'mention, got {count}')
  if nps:
    return ' and '.join(nps)
  return _pick(rng, ('something', 'a scene'))


def render_caption(rng: np.random.Generator, mention: Mapping[str, Any]
                   ) -> tuple[str, int]:
  """(caption text, template index) saying exactly the mentioned statements."""
  template_id = int(rng.integers(len(TEMPLATES)))
  slots = {'objs': objects_phrase(rng, mention)}
  if 'background' in mention:
    slots['bg'] = _pick(rng, BACKGROUND_WORDS[mention['background']])
  if 'sound' in mention:
    slots['snd'] = _pick(rng, SOUND_WORDS[mention['sound']])
  text = ''.join(piece.format(**slots) for piece in TEMPLATES[template_id]
                 if all(s in slots for s in _SLOT.findall(piece)))
  return text[0].upper() + text[1:], template_id


# The fixed words of `objects_phrase` and `with_article`.
_PHRASE_WORDS = ('a single', 'one', 'only one', 'two objects', 'two shapes', 'a pair of shapes',
                 'one of them', 'including', 'and', 'something', 'a scene', 'a', 'an')


def caption_vocabulary() -> tuple[str, ...]:
  """Every word a caption can contain, lower-cased and sorted (the ASR noise of the
  spoken-caption variant substitutes among them)."""
  texts = list(_PHRASE_WORDS) + list(GENERIC_NOUNS)
  for table in (SHAPE_WORDS, COLOUR_WORDS, MOTION_WORDS, BACKGROUND_WORDS, SOUND_WORDS):
    texts += [w for options in table.values() for w in options]
  texts += [_SLOT.sub(' ', piece) for template in TEMPLATES for piece in template]
  return tuple(sorted({w for t in texts for w in re.findall(r"[a-z']+", t.lower())}))


def _desc_fits(desc: Mapping[str, str], obj: Mapping[str, str]) -> bool:
  return all(obj[field] == value for field, value in desc.items())


def caption_fits(caption_attrs: Mapping[str, Any],
                 clip_attrs: Mapping[str, Any]) -> bool:
  """True iff every statement of the caption is true of the clip.

  Scene-level statements (num_objects, background, sound) must equal the
  clip's. Object descriptions bind to distinct clip objects: the caption fits
  only if some one-to-one assignment of its descriptions to the clip's objects
  makes every described field match. A caption that does not state the count
  fits clips with more objects than it describes.
  """
  for key in ('num_objects', 'background', 'sound'):
    if key in caption_attrs and caption_attrs[key] != clip_attrs[key]:
      return False
  descs = caption_attrs.get('objects', ())
  return any(all(_desc_fits(d, o) for d, o in zip(descs, assignment))
             for assignment in itertools.permutations(clip_attrs['objects'],
                                                      len(descs)))


_OBJECT_VOCAB = {'shape': world.SHAPES, 'colour': world.COLOUR_NAMES,
                 'motion': world.MOTION_NAMES}


def _encode_clips(clips: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
  """Attribute ids; object fields are [N, MAX_OBJECTS], -1 where absent."""
  fields = {f: np.full((len(clips), world.MAX_OBJECTS), -1)
            for f in _OBJECT_VOCAB}
  for i, clip in enumerate(clips):
    for j, obj in enumerate(clip['objects']):
      for f, names in _OBJECT_VOCAB.items():
        fields[f][i, j] = names.index(obj[f])
  return {
      'num_objects': np.array([c['num_objects'] for c in clips]),
      'background': np.array([world.BACKGROUNDS.index(c['background'])
                              for c in clips]),
      'sound': np.array([world.SOUNDS.index(c['sound']) for c in clips]),
      **fields,
  }


def num_fitting_clips(captions: Sequence[Mapping[str, Any]],
                      clips: Sequence[Mapping[str, Any]]) -> np.ndarray:
  """int [len(captions)]: how many of `clips` each caption fits.

  Equal to counting `caption_fits` over all pairs; a vectorized necessary
  condition (every description matches some object) prunes the candidates
  before `caption_fits` decides.
  """
  enc = _encode_clips(clips)
  index = {'num_objects': None, 'background': world.BACKGROUNDS,
           'sound': world.SOUNDS}
  counts = np.zeros(len(captions), dtype=np.int64)
  for c, cap in enumerate(captions):
    ok = np.ones(len(clips), dtype=bool)
    for key, names in index.items():
      if key in cap:
        value = cap[key] if names is None else names.index(cap[key])
        ok &= enc[key] == value
    for desc in cap.get('objects', ()):
      per_object = np.ones((len(clips), world.MAX_OBJECTS), dtype=bool)
      for field, value in desc.items():
        per_object &= enc[field] == _OBJECT_VOCAB[field].index(value)
      ok &= per_object.any(axis=1)
    candidates = np.flatnonzero(ok)
    if len(cap.get('objects', ())) > 1:
      candidates = [i for i in candidates if caption_fits(cap, clips[i])]
    counts[c] = len(candidates)
  return counts


def oracle_recall_at_1(num_fitting: Sequence[int] | np.ndarray) -> float:
  """Best achievable text-to-video R@1 (%) given caption ambiguity.

  A caption that fits n clips of the gallery (its own clip included) is
  retrieved at rank 1 with probability at most 1/n by any model that cannot
  tell those clips apart from the caption, so R@1 <= mean_c 1/n_c.
  """
  n = np.asarray(num_fitting, dtype=np.float64)
  if n.size == 0 or np.any(n < 1):
    raise ValueError(f'oracle_recall_at_1: every caption must fit >= 1 clip '
                     f'(its own); got counts {n[:10]}...')
  return float(100.0 * np.mean(1.0 / n))


# ---- reading attributes back from free text (generated captions) ----------

_COUNT_PHRASES = (('a pair of shapes', 2), ('two objects', 2), ('two shapes', 2),
                  ('a single', 1), ('only one', 1))
_STATEMENT_PHRASES = sorted(
    [(w, ('shape', k)) for k, ws in SHAPE_WORDS.items() for w in ws]
    + [(w, ('colour', k)) for k, ws in COLOUR_WORDS.items() for w in ws]
    + [(w, ('motion', k)) for k, ws in MOTION_WORDS.items() for w in ws]
    + [(w, ('background', k)) for k, ws in BACKGROUND_WORDS.items() for w in ws]
    + [(w, ('sound', k)) for k, ws in SOUND_WORDS.items() for w in ws]
    + [(w, ('num_objects', n)) for w, n in _COUNT_PHRASES],
    key=lambda item: -len(item[0]))


def parse_statements(text: str) -> set[tuple[str, Any]]:
  """The attribute statements a caption's words make, as unbound atoms.

  Atoms are ('num_objects', n), ('background', b), ('sound', s), ('shape', x),
  ('colour', c), ('motion', m): every synonym of `render_caption`'s word lists
  is recognized, longest phrase first, so any text (a model's caption) can be
  scored against a clip with `statement_precision_recall`. Objects are not
  bound: "a red square and a blue circle" says red, blue, square, circle.
  """
  rest = ' ' + re.sub(r'[^a-z\- ]+', ' ', text.lower()) + ' '
  found = set()
  for phrase, atom in _STATEMENT_PHRASES:
    pattern = r'(?<![a-z\-])' + re.escape(phrase) + r'(?![a-z\-])'
    if re.search(pattern, rest):
      found.add(atom)
      rest = re.sub(pattern, ' ', rest)
  if re.search(r'(?<![a-z\-])one(?![a-z\-])(?! of them)', rest):
    found.add(('num_objects', 1))
  return found


def mention_statements(mention: Mapping[str, Any]) -> set[tuple[str, Any]]:
  """`parse_statements`'s atoms of a mention dict (what a caption says)."""
  atoms = {(key, mention[key]) for key in ('num_objects', 'background', 'sound')
           if key in mention}
  for desc in mention.get('objects', ()):
    atoms.update(desc.items())
  return atoms


def clip_statements(attributes: Mapping[str, Any]) -> set[tuple[str, Any]]:
  """Every atom true of a clip (its ground-truth attributes)."""
  return mention_statements({key: attributes[key] for key in
                             ('num_objects', 'background', 'sound', 'objects')})


def statement_precision_recall(texts: Sequence[str],
                               attributes: Sequence[Mapping[str, Any]]) -> dict[str, float]:
  """Attribute precision and recall (%) of captions against their clips, micro-averaged.

  precision: of all statements the captions make, the share true of their
  clip; recall: of all the clips' atoms, the share their caption states.
  A caption stating nothing contributes no statements (and no precision).
  """
  said = true = total = 0
  for text, attrs in zip(texts, attributes, strict=True):
    stated, truth = parse_statements(text), clip_statements(attrs)
    said += len(stated)
    true += len(stated & truth)
    total += len(truth)
  return {'attribute_precision': 100.0 * true / max(said, 1),
          'attribute_recall': 100.0 * true / max(total, 1),
          'attributes_per_caption': said / max(len(texts), 1)}
