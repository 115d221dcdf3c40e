"""TVR / TVC-style long videos: multi-scene videos with a subtitle stream and moments.

The video is `multiscene.sample_multiscene_video` (the one multi-scene
generator; rendering is `MultiSceneSource`'s). On top of it, drawn from
rng.text in this order:

Cast. Each video has 2-3 speakers from `CAST`.

Subtitles. Every scene has one *topic line*: a speaker says something about a
topic from `TOPICS` (each topic at most once per video), which nothing in the
pixels or the sound shows. With probability `seen_line_rate` the scene also
has a *seen line*, another speaker remarking on what is seen or heard ("Look
at the scarlet disc!", "Can you hear a beep?"), built from `captions`'
attribute words. The lines of a scene split its interval in halves (random
order), each trimmed by up to a quarter of its half at both ends, so a line
never crosses a cut. Text is "<Speaker> : <line>", as TVQA's subtitles.

Moments. `moments_per_video` distinct scenes (fewer if the video has fewer),
each a moment whose start/end are that scene's boundaries. Each moment has
`descs_per_moment` descriptions (TVC: 2 in train, 4 elsewhere; TVR uses one
query per moment), of a type drawn uniformly from
  "v"   video only: `render_caption` of a visual mention (count, background,
        objects' shape / colour / motion; never the sound) that is a referring
        expression of the scene: it fits no other scene of the video (TVR:
        "the query should be a referring expression that uniquely localizes
        the moment"; `referring_mention`);
  "t"   subtitle only: who talks about which topic ("Alice tells Bob about
        her lost keys."), true of the scene's topic line and not visible;
  "vt"  both: the topic clause + "as we see" + the scene's objects (count,
        shape, colour, motion; sometimes the background), never the sound.
The types are the TVR / TVC `type` values. Each description stores its
mention dict (the visual attributes it states; `captions.caption_fits` holds)
and, for "t" / "vt", what it says was said: speaker, topic and the listener it
names (None when the sentence names none).

`fitting_scenes` says which scenes a description is true of, from the ground
truth; `query_oracle` turns that into the VR / SVMR / VCMR R@1 bound of a corpus
(the TVR counterpart of `captions.oracle_recall_at_1`).

Example i of a split depends only on (seed, split, i).
"""
from __future__ import annotations

import copy
from typing import Any

import numpy as np

from avtext.data.builders import tvc
from avworld import captions
from avworld import multiscene
from avworld import world

CAST = ('Alice', 'Bob', 'Carol', 'Dave', 'Erin', 'Frank', 'Grace', 'Henry')
# topic -> (subtitle lines, description noun phrases). The lines never use the
# attribute words of `captions`, so a topic is only in the subtitles.
TOPICS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    'keys': (("I can't find my keys anywhere.", 'Has anyone seen my keys?',
              'I think I left the keys in the car.'), ('the lost keys', 'the keys')),
    'coffee': (('I need another cup of coffee.', 'This coffee is terrible.',
                'Who drank all the coffee?'), ('coffee', 'the coffee')),
    'train': (('We are going to miss the train.', 'The train was late again.',
               'When does the next train leave?'), ('the train', 'catching the train')),
    'rain': (("It's going to rain all weekend.", 'I forgot my umbrella and got soaked.',
              'Look at this weather, it keeps raining.'), ('the rain', 'the weather')),
    'exam': (('I failed the exam.', 'The exam is tomorrow and I have not studied.',
              'How did your exam go?'), ('the exam', 'an exam')),
    'birthday': (("Tomorrow is Sam's birthday.", 'I forgot my own birthday.',
                  'What should I buy for her birthday?'), ('a birthday', 'the birthday')),
    'dog': (('The dog ate my sandwich.', 'Did you walk the dog?',
             'My dog keeps barking at night.'), ('the dog', 'a dog')),
    'job': (('I quit my job today.', 'I have a job interview on Monday.',
             'My boss wants me to work late.'), ('work', 'the job')),
    'dinner': (("Let's order pizza for dinner.", 'Dinner is almost ready.',
                'Who is cooking dinner tonight?'), ('dinner', 'what to eat')),
    'movie': (('That movie was so boring.', 'Do you want to see a movie tonight?',
               'I cried at the end of the movie.'), ('a movie', 'the film')),
    'money': (('Can you lend me some money?', 'I spent all my money on shoes.',
               'We need to save money this month.'), ('money', 'the money')),
    'phone': (('My phone battery is dead.', 'I dropped my phone in the sink.',
               'Why did you not answer your phone?'), ('the phone', 'a phone call')),
}
TOPIC_NAMES = tuple(TOPICS)
QUERY_TYPES = ('v', 't', 'vt')
_TALK = ('{a} talks about {np}.', '{a} mentions {np}.', '{a} tells {b} about {np}.',
         '{a} brings up {np}.', '{a} and {b} discuss {np}.', '{a} complains to {b} about {np}.')
_SEEN_OBJECT = ('Look at the {x}!', 'Do you see the {x}?', 'What is that {x} doing?')
_SEEN_BACKGROUND = ('I like this {x} background.', 'Why is everything so {x} here?')
_SEEN_SOUND = ('Can you hear {x}?', 'What is {x} doing here?')
DEFAULT_SPLIT_SIZES = {'train': 5000, 'val': 500, 'test': 500}


def _pick(rng: np.random.Generator, options):
  return options[int(rng.integers(len(options)))]


def full_visual_mention(attributes: dict) -> dict[str, Any]:
  """Every visual statement of a scene: its count, background and all objects' fields."""
  return {'num_objects': attributes['num_objects'], 'background': attributes['background'],
          'objects': [{f: obj[f] for f in world.OBJECT_FIELDS}
                      for obj in attributes['objects']]}


def referring_mention(rng: np.random.Generator, attributes: dict, others, *,
                      tries: int = 32) -> dict[str, Any]:
  """A visual mention of the scene (no sound) that fits none of `others` (attribute dicts).

  `captions.sample_mention` without sound, drawn again until no other scene fits,
  up to `tries` times; then the full visual description (which fits another scene
  only if that scene looks the same).
  """
  for _ in range(tries):
    mention = captions.sample_mention(rng, attributes, sound_rate=0.0)
    if not any(captions.caption_fits(mention, o) for o in others):
      return mention
  return full_visual_mention(attributes)


def _seen_line(rng: np.random.Generator, attributes: dict) -> tuple[str, dict]:
  """A remark on the scene; (text, mention dict of what it states)."""
  kind = _pick(rng, ('object', 'object', 'background', 'sound'))
  if kind == 'object':
    obj = attributes['objects'][int(rng.integers(attributes['num_objects']))]
    fields = [f for f in world.OBJECT_FIELDS if rng.random() < 0.6] or ['shape']
    desc = {f: obj[f] for f in world.OBJECT_FIELDS if f in fields}
    return (_pick(rng, _SEEN_OBJECT).format(x=captions.object_phrase(rng, desc)),
            {'objects': [desc]})
  if kind == 'background':
    word = _pick(rng, captions.BACKGROUND_WORDS[attributes['background']])
    return _pick(rng, _SEEN_BACKGROUND).format(x=word), {
        'background': attributes['background'], 'objects': []}
  word = _pick(rng, captions.SOUND_WORDS[attributes['sound']])
  return _pick(rng, _SEEN_SOUND).format(x=word), {'sound': attributes['sound'], 'objects': []}


class LongVideoSource(multiscene.MultiSceneSource):
  """Long videos with subtitles and described moments (TVR / TVC synthetic data)."""
  STREAM = 'longvideo'

  def __init__(self, split: str, *, seed: int = 0, num_examples: int | None = None,
               spec: world.WorldSpec = world.WorldSpec(),
               num_scenes: tuple[int, int] = (4, 8),
               scene_duration_s: tuple[float, float] = (3.0, 7.5),
               moments_per_video: int = 3, descs_per_moment: int | None = None,
               seen_line_rate: float = 0.5, clip_length_s: float = tvc.CLIP_LENGTH):
    super().__init__(split, seed=seed, num_examples=num_examples, spec=spec,
                     num_scenes=num_scenes, scene_duration_s=scene_duration_s)
    if num_examples is None:
      self.num_examples = DEFAULT_SPLIT_SIZES[split]
    if moments_per_video < 1:
      raise ValueError(f'moments_per_video must be >= 1, got {moments_per_video}')
    self.moments_per_video = int(moments_per_video)
    self.descs_per_moment = int(descs_per_moment or (2 if split == 'train' else 4))
    self.seen_line_rate = float(seen_line_rate)
    self.clip_length_s = float(clip_length_s)

  def __repr__(self) -> str:
    return (f'LongVideoSource(split={self.split!r}, seed={self.seed}, '
            f'num_examples={self.num_examples})')

  def _annotate(self, rng: world.ExampleRng, video: multiscene.MultiSceneVideo) -> Any:
    r = rng.text
    cast = [CAST[k] for k in r.choice(len(CAST), size=int(r.integers(2, 4)), replace=False)]
    if len(video.scenes) > len(TOPIC_NAMES):
      raise ValueError(f'{self!r}: {len(video.scenes)} scenes but only {len(TOPIC_NAMES)} '
                       'topics; lower num_scenes')
    topics = [TOPIC_NAMES[t] for t in r.choice(len(TOPIC_NAMES), size=len(video.scenes),
                                               replace=False)]
    lines = []
    for k, (scene, topic) in enumerate(zip(video.scenes, topics)):
      attrs = scene.attributes()
      talker = int(r.integers(len(cast)))
      scene_lines = [{'speaker': cast[talker], 'line': _pick(r, TOPICS[topic][0]),
                      'topic': topic, 'about': None}]
      if r.random() < self.seen_line_rate:
        other = cast[(talker + 1 + int(r.integers(len(cast) - 1))) % len(cast)]
        text, about = _seen_line(r, attrs)
        scene_lines.insert(int(r.integers(2)), {'speaker': other, 'line': text, 'topic': None,
                                                'about': about})
      a, b = video.boundaries[k], video.boundaries[k + 1]
      half = (b - a) / len(scene_lines)
      for j, line in enumerate(scene_lines):
        lo, hi = a + j * half, a + (j + 1) * half
        trim = r.uniform(0.0, 0.25, size=2) * half
        line.update(start=round(lo + trim[0], 3), end=round(hi - trim[1], 3), scene=k)
        lines.append(line)
    n = min(self.moments_per_video, len(video.scenes))
    moment_scenes = sorted(int(k) for k in r.choice(len(video.scenes), size=n, replace=False))
    moments = []
    for k in moment_scenes:
      attrs = video.scenes[k].attributes()
      topic_line = next(l for l in lines if l['scene'] == k and l['topic'])
      others = [s.attributes() for j, s in enumerate(video.scenes) if j != k]
      descs = [self._describe(r, attrs, others, topic_line, cast)
               for _ in range(self.descs_per_moment)]
      moments.append((k, descs))
    return cast, lines, moments

  def _describe(self, r: np.random.Generator, attrs: dict, others: list[dict],
                topic_line: dict, cast: list[str]) -> dict:
    kind = _pick(r, QUERY_TYPES)
    desc: dict[str, Any] = {'type': kind}
    if kind in ('t', 'vt'):
      a = topic_line['speaker']
      b = _pick(r, [c for c in cast if c != a])
      template = _pick(r, _TALK)
      talk = template.format(a=a, b=b, np=_pick(r, TOPICS[topic_line['topic']][1]))
      desc['said'] = {'speaker': a, 'topic': topic_line['topic'],
                      'listener': b if '{b}' in template else None}
    if kind == 'v':
      mention = referring_mention(r, attrs, others)
      desc['text'], _ = captions.render_caption(r, mention)
    elif kind == 't':
      mention = {'objects': []}
      desc['text'] = talk
    else:
      mention = captions.sample_mention(r, attrs)
      mention.pop('sound', None)
      if not mention['objects'] and 'num_objects' not in mention:
        obj = attrs['objects'][int(r.integers(attrs['num_objects']))]
        mention['objects'] = [{'shape': obj['shape']}]
      seen = captions.objects_phrase(r, mention)
      if 'background' in mention:
        seen += f" on a {_pick(r, captions.BACKGROUND_WORDS[mention['background']])} background"
      desc['text'] = f'{talk[:-1]} as we see {seen}.'
    desc['mentioned'] = mention
    return desc

  def num_clips(self, index: int) -> int:
    """Clips of `clip_length_s` covering the video (TVR: ceil(duration / 1.5))."""
    return int(np.ceil(self.video(index).duration_s / self.clip_length_s - 1e-9))

  def describe(self, index: int) -> dict[str, Any]:
    """Everything but pixels and samples: scenes, subtitles, moments with descriptions."""
    video, (cast, lines, moments) = self._sample(index)
    vid = self.video_id(index)
    scenes = [{'start_s': video.boundaries[k], 'stop_s': video.boundaries[k + 1],
               'attributes': s.attributes()} for k, s in enumerate(video.scenes)]
    subtitles = [{'start': l['start'], 'end': l['end'], 'text': f"{l['speaker']} : {l['line']}",
                  'speaker': l['speaker'], 'topic': l['topic'], 'about': copy.deepcopy(l['about'])}
                 for l in lines]
    out_moments = []
    for m, (k, descs) in enumerate(moments):
      out_moments.append({
          'moment_id': f'{vid}-m{m}', 'scene': k,
          'ts': [video.boundaries[k], video.boundaries[k + 1]],
          'attributes': scenes[k]['attributes'],
          'descs': [{'desc': d['text'], 'type': d['type'], 'desc_id': f'{vid}-m{m}-d{j}',
                     'mentioned': copy.deepcopy(d['mentioned']),
                     **({'said': dict(d['said'])} if 'said' in d else {})}
                    for j, d in enumerate(descs)]})
    return {'video_id': vid, 'duration_s': video.duration_s,
            'num_frames': self.num_frames(index), 'num_clips': self.num_clips(index),
            'cast': list(cast), 'scenes': scenes, 'subtitles': subtitles,
            'moments': out_moments}


def fitting_scenes(desc: dict, video: dict) -> list[int]:
  """Indices of the scenes of `video` (a `describe` dict) that `desc` (one of its
  moments' descriptions, from any video) is true of.

  True of a scene: its mention fits the scene's ground truth (`captions.caption_fits`)
  and, for what was said, the scene's topic line has the stated speaker and topic and
  the video's cast holds the listener it names.
  """
  said = desc.get('said')
  if said and said.get('listener') and said['listener'] not in video['cast']:
    return []
  topic_lines = {}
  if said:
    for s in video['subtitles']:
      if s['topic']:
        k = next(j for j, sc in enumerate(video['scenes']) if s['start'] < sc['stop_s'])
        topic_lines[k] = (s['speaker'], s['topic'])
  return [k for k, scene in enumerate(video['scenes'])
          if (not said or topic_lines.get(k) == (said['speaker'], said['topic']))
          and captions.caption_fits(desc['mentioned'], scene['attributes'])]


def query_oracle(videos: list[dict], *, first_only: bool = True) -> dict[str, dict[str, float]]:
  """The R@1 (%) bound of a corpus, by query type and over all queries.

  `videos` are `describe` dicts, the corpus; the queries are their moments'
  descriptions (the first of each moment with `first_only`, TVR's one query per
  moment). A query true of n scenes of the corpus lies in n_v videos and in m of its
  own video's scenes; a model that cannot tell those apart from the query ranks its
  own at 1 with probability at most 1/n (VCMR at IoU 0.5 / 0.7: the moments are
  whole, disjoint scenes), 1/n_v (VR) and 1/m (SVMR); the bound is the mean over the
  queries (an expectation: on one corpus a model's tie-breaking can be luckier).
  Returns {type: {"VCMR", "VR", "SVMR": R@1 bound, "num_queries",
  "median_fitting_scenes"}} for each type present and "all".
  """
  rows: dict[str, list[tuple[float, float, float, int]]] = {}
  for v, video in enumerate(videos):
    for m in video['moments']:
      for desc in (m['descs'][:1] if first_only else m['descs']):
        fits = [fitting_scenes(desc, other) for other in videos]
        if m['scene'] not in fits[v]:
          raise ValueError(f"query {desc['desc_id']!r} is not true of its own moment "
                           f"{m['moment_id']!r}")
        n = sum(len(f) for f in fits)
        n_videos = sum(bool(f) for f in fits)
        rows.setdefault(desc['type'], []).append((1 / n, 1 / n_videos, 1 / len(fits[v]), n))
  if not rows:
    raise ValueError('query_oracle: the videos have no moments')
  rows['all'] = [r for t in list(rows) for r in rows[t]]
  out = {}
  for t, r in rows.items():
    a = np.asarray(r, np.float64)
    out[t] = {'VCMR': float(100 * a[:, 0].mean()), 'VR': float(100 * a[:, 1].mean()),
              'SVMR': float(100 * a[:, 2].mean()), 'num_queries': len(a),
              'median_fitting_scenes': float(np.median(a[:, 3]))}
  return out
