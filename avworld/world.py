"""Core of the synthetic audio-visual-text world: attributes, RNG, rendering.

The world is procedural: a `Scene` (1-2 coloured shapes moving over a
background, plus an independent sound) is sampled from a per-example random
stream and rendered on demand. Every dataset variant (clip-caption pairs,
paragraph videos, long videos with moments, mining corpora, spoken captions)
builds on these pieces:

  rng = example_rng(seed, stream='clips/train', index=i)
  scene = sample_scene(rng.visual, rng.audio, spec)
  frames = render_frames(scene, times_s, spec)        # uint8 [n, H, W, 3]
  audio = render_audio(scene, start, num, spec)       # float32 [num]

Rendering is a pure function of (scene, time): any frame or audio sample can be
produced alone and equals the same frame/sample of a full rendering bit for
bit, so training can decode 8 frames instead of 250.

Sound is sampled from its own random stream, independent of the visuals, so
words about sound can only be grounded through the audio track.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

# ---------------------------------------------------------------- vocabulary
SHAPES = ('circle', 'square', 'triangle', 'cross')
# Saturated colours; backgrounds are grey (R = G = B), so an object pixel can
# never be confused with a background pixel.
COLOURS: Mapping[str, tuple[int, int, int]] = {
    'red': (230, 25, 25),
    'green': (30, 190, 40),
    'blue': (35, 70, 235),
    'yellow': (240, 220, 20),
    'purple': (150, 40, 210),
    'orange': (250, 130, 10),
}
COLOUR_NAMES = tuple(COLOURS)
# Unit direction in image coordinates (x right, y down).
MOTIONS: Mapping[str, tuple[int, int]] = {
    'still': (0, 0),
    'left': (-1, 0),
    'right': (1, 0),
    'up': (0, -1),
    'down': (0, 1),
}
MOTION_NAMES = tuple(MOTIONS)
BACKGROUNDS = ('plain', 'striped', 'gradient', 'checkered')
SOUNDS = ('silence', 'tone', 'chirp', 'noise', 'drum')
MAX_OBJECTS = 2
OBJECT_FIELDS = ('shape', 'colour', 'motion')

# Audio is synthesized in aligned blocks so that a partial rendering runs the
# exact same vectorized arithmetic on every sample as a full rendering does.
_AUDIO_BLOCK = 1024
_FADE_S = 0.005  # Edge ramps that keep bursts and sweeps free of clicks.
_NOISE_TABLE_LEN = 65537  # ~4.1 s at 16 kHz (prime, so no block alignment)


@dataclasses.dataclass(frozen=True)
class WorldSpec:
  """Rendering format and nuisance ranges of the synthetic world.

  Sizes and speeds are fractions of the frame so a 32x32 test world looks like
  a scaled 64x64 one. At 64x64 the defaults give objects 12-24 px across that
  move 8-16 px/s, i.e. 20-40 px over a 2.5 s window.
  """
  height: int = 64
  width: int = 64
  fps: float = 25.0
  duration_s: float = 10.0
  sample_rate: int = 16000
  object_size: tuple[float, float] = (0.19, 0.375)  # diameter / min(H, W)
  object_speed: tuple[float, float] = (0.125, 0.25)  # frame sizes per second
  background_level: tuple[int, int] = (80, 130)  # grey level of the base
  background_contrast: tuple[int, int] = (12, 25)  # +- around the base
  audio_noise_floor: float = 1e-3  # peak amplitude of the always-on hiss

  def __post_init__(self):
    if self.height < 8 or self.width < 8:
      raise ValueError(f'WorldSpec: frames must be at least 8x8, got '
                       f'{self.height}x{self.width}')
    if self.fps <= 0 or self.duration_s <= 0 or self.sample_rate <= 0:
      raise ValueError(f'WorldSpec: fps, duration_s and sample_rate must be '
                       f'positive, got {self.fps}, {self.duration_s}, '
                       f'{self.sample_rate}')

  @property
  def num_frames(self) -> int:
    return int(round(self.duration_s * self.fps))

  @property
  def num_samples(self) -> int:
    return int(round(self.duration_s * self.sample_rate))

  def frame_times(self, frame_indices: Sequence[int] | np.ndarray
                  ) -> np.ndarray:
    return np.asarray(frame_indices, dtype=np.float64) / self.fps


# ---------------------------------------------------------------- scene
@dataclasses.dataclass(frozen=True)
class SceneObject:
  """One shape. Position (x0, y0) at t = 0 in pixels; wraps around edges."""
  shape: str
  colour: str
  motion: str
  size: float  # diameter in pixels
  x0: float
  y0: float
  speed: float  # pixels per second along the motion direction


@dataclasses.dataclass(frozen=True)
class Background:
  kind: str
  level: int
  contrast: int
  period: float  # stripe period / checker cell size in pixels
  angle: float  # gradient direction / stripe orientation (radians)
  phase: float  # pattern offset in pixels


@dataclasses.dataclass(frozen=True)
class Sound:
  """A sound that starts at `onset` (samples) and lasts to the clip's end.

  Repeating sounds (chirp, noise, drum) repeat every `period_s`, so any window
  of a few seconds contains several events of the clip's sound type.
  """
  kind: str
  onset: int
  level: float  # peak amplitude
  freq: float = 0.0  # tone pitch / drum pitch / chirp start (Hz)
  freq_end: float = 0.0  # chirp end (Hz)
  period_s: float = 0.0
  length_s: float = 0.0  # noise burst length / drum decay constant
  phase: float = 0.0
  noise_key: int = 0  # offsets into the noise table (see `_noise`)


@dataclasses.dataclass(frozen=True)
class Scene:
  objects: tuple[SceneObject, ...]  # drawn in order; the last is on top
  background: Background
  sound: Sound

  def attributes(self) -> dict[str, Any]:
    """The ground-truth attributes captions talk about (JSON-serializable)."""
    return {
        'num_objects': len(self.objects),
        'objects': [{'shape': o.shape, 'colour': o.colour, 'motion': o.motion}
                    for o in self.objects],
        'background': self.background.kind,
        'sound': self.sound.kind,
    }

  def nuisance(self) -> dict[str, Any]:
    """Everything else that was sampled (JSON-serializable, exact floats)."""
    return {
        'objects': [{'size': o.size, 'x0': o.x0, 'y0': o.y0, 'speed': o.speed}
                    for o in self.objects],
        'background': dataclasses.asdict(self.background),
        'sound': dataclasses.asdict(self.sound),
    }

  def fingerprint(self) -> str:
    """A content hash: two scenes with the same fingerprint render the same."""
    blob = json.dumps([self.attributes(), self.nuisance()], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


# ---------------------------------------------------------------- labels
# Multi-hot attribute labels: what a pretraining stage can be supervised with
# (the world's stand-in for ImageNet / Kinetics classes). Group -> values.
LABEL_GROUPS: Mapping[str, tuple[str, ...]] = {
    'shape': SHAPES,
    'colour': COLOUR_NAMES,
    'motion': MOTION_NAMES,
    'background': BACKGROUNDS,
    'sound': SOUNDS,
    'count': tuple(str(n) for n in range(1, MAX_OBJECTS + 1)),
}
LABEL_NAMES = tuple(f'{g}:{v}' for g, values in LABEL_GROUPS.items()
                    for v in values)


def attribute_labels(attributes: Mapping[str, Any]) -> np.ndarray:
  """float32 multi-hot [len(LABEL_NAMES)] of `Scene.attributes()`.

  Shape, colour and motion are set for every object present (1-2 each);
  background, sound and count are one-hot.
  """
  index = {name: i for i, name in enumerate(LABEL_NAMES)}
  y = np.zeros(len(LABEL_NAMES), np.float32)
  for obj in attributes['objects']:
    for field in OBJECT_FIELDS:
      y[index[f'{field}:{obj[field]}']] = 1.0
  y[index[f"background:{attributes['background']}"]] = 1.0
  y[index[f"sound:{attributes['sound']}"]] = 1.0
  y[index[f"count:{attributes['num_objects']}"]] = 1.0
  return y


# ---------------------------------------------------------------- RNG
class ExampleRng(NamedTuple):
  """Independent generators for one example; callers draw in a fixed order."""
  visual: np.random.Generator
  audio: np.random.Generator
  text: np.random.Generator


def example_rng(seed: int, stream: str, index: int) -> ExampleRng:
  """Random streams of example `index` of `stream` (e.g. 'clips/test').

  The stream name is hashed into the SeedSequence entropy, so different
  streams (splits, dataset variants) are statistically disjoint, and example i
  never depends on examples 0..i-1 (random access).
  """
  if seed < 0 or index < 0:
    raise ValueError(f'example_rng: seed and index must be >= 0, got '
                     f'seed={seed}, index={index}')
  digest = hashlib.sha256(stream.encode()).digest()
  words = [int.from_bytes(digest[k:k + 4], 'little') for k in range(0, 16, 4)]
  children = np.random.SeedSequence([seed, *words, index]).spawn(3)
  return ExampleRng(*(np.random.Generator(np.random.PCG64(c))
                      for c in children))


def sample_objects(rng: np.random.Generator, spec: WorldSpec
                   ) -> tuple[SceneObject, ...]:
  """1-2 objects with distinct colours, fully inside the frame at t = 0."""
  n = int(rng.integers(1, MAX_OBJECTS + 1))
  colours = rng.choice(len(COLOUR_NAMES), size=n, replace=False)
  side = min(spec.height, spec.width)
  objects = []
  for colour in colours:
    shape = SHAPES[rng.integers(len(SHAPES))]
    motion = MOTION_NAMES[rng.integers(len(MOTION_NAMES))]
    size = float(rng.uniform(*spec.object_size) * side)
    r = size / 2
    x0 = float(rng.uniform(r, spec.width - r))
    y0 = float(rng.uniform(r, spec.height - r))
    extent = spec.height if motion in ('up', 'down') else spec.width
    speed = 0.0 if motion == 'still' else float(
        rng.uniform(*spec.object_speed) * extent)
    objects.append(SceneObject(shape, COLOUR_NAMES[colour], motion, size, x0,
                               y0, speed))
  return tuple(objects)


def sample_background(rng: np.random.Generator, spec: WorldSpec
                      ) -> Background:
  side = min(spec.height, spec.width)
  kind = BACKGROUNDS[rng.integers(len(BACKGROUNDS))]
  return Background(
      kind=kind,
      level=int(rng.integers(spec.background_level[0],
                             spec.background_level[1] + 1)),
      contrast=int(rng.integers(spec.background_contrast[0],
                                spec.background_contrast[1] + 1)),
      period=float(rng.uniform(0.1, 0.2) * side),
      angle=float(rng.uniform(0, 2 * math.pi)),
      phase=float(rng.uniform(0, side)))


def sample_sound(rng: np.random.Generator, spec: WorldSpec) -> Sound:
  """One of SOUNDS with random onset, level and type-specific parameters.

  The types differ in spectrum and time structure: a steady sinusoid
  (300-1200 Hz), repeated linear sweeps between 300-700 Hz and 2.5-5 kHz (up
  or down), broadband noise bursts, low (80-200 Hz) decaying drum hits a few
  times per second, and the noise floor alone.
  """
  kind = SOUNDS[rng.integers(len(SOUNDS))]
  max_onset = min(0.5, spec.duration_s / 4)
  onset = int(round(rng.uniform(0, max_onset) * spec.sample_rate))
  level = float(rng.uniform(0.25, 0.6))
  noise_key = int(rng.integers(0, 2**63))
  if kind == 'silence':
    return Sound(kind, onset, 0.0, noise_key=noise_key)
  if kind == 'tone':
    return Sound(kind, onset, level, freq=float(np.exp(
        rng.uniform(np.log(300), np.log(1200)))),
                 phase=float(rng.uniform(0, 2 * math.pi)),
                 noise_key=noise_key)
  if kind == 'chirp':
    low, high = float(rng.uniform(300, 700)), float(rng.uniform(2500, 5000))
    rising = bool(rng.integers(2))
    return Sound(kind, onset, level, freq=low if rising else high,
                 freq_end=high if rising else low,
                 period_s=float(rng.uniform(0.4, 0.9)), noise_key=noise_key)
  if kind == 'noise':
    return Sound(kind, onset, level, period_s=float(rng.uniform(0.4, 0.8)),
                 length_s=float(rng.uniform(0.15, 0.3)), noise_key=noise_key)
  # drum: decaying low sinusoids a few times per second.
  return Sound(kind, onset, level, freq=float(rng.uniform(80, 200)),
               period_s=float(rng.uniform(0.15, 0.35)),
               length_s=float(rng.uniform(0.02, 0.04)), noise_key=noise_key)


def sample_scene(visual_rng: np.random.Generator,
                 audio_rng: np.random.Generator, spec: WorldSpec) -> Scene:
  objects = sample_objects(visual_rng, spec)
  background = sample_background(visual_rng, spec)
  return Scene(objects, background, sample_sound(audio_rng, spec))


# ---------------------------------------------------------------- frames
def _background_image(bg: Background, spec: WorldSpec) -> np.ndarray:
  """uint8 [H, W, 3] grey pattern with values in level +- contrast."""
  y, x = np.meshgrid(np.arange(spec.height) + 0.5,
                     np.arange(spec.width) + 0.5, indexing='ij')
  if bg.kind == 'plain':
    value = np.full(x.shape, float(bg.level))
  elif bg.kind == 'striped':
    # Stripes run horizontally or vertically (angle picks which).
    coord = x if math.cos(bg.angle) >= 0 else y
    value = bg.level + bg.contrast * np.where(
        np.floor((coord + bg.phase) / bg.period) % 2 == 0, 1.0, -1.0)
  elif bg.kind == 'gradient':
    cos, sin = math.cos(bg.angle), math.sin(bg.angle)
    proj = (x - spec.width / 2) * cos + (y - spec.height / 2) * sin
    # Normalized by the largest |proj| in the frame: the ramp spans exactly
    # level +- contrast whatever its direction.
    value = bg.level + bg.contrast * proj / (
        spec.width / 2 * abs(cos) + spec.height / 2 * abs(sin))
  elif bg.kind == 'checkered':
    cells = (np.floor((x + bg.phase) / bg.period) +
             np.floor((y + bg.phase) / bg.period))
    value = bg.level + bg.contrast * np.where(cells % 2 == 0, 1.0, -1.0)
  else:
    raise ValueError(f'unknown background {bg.kind!r}; expected one of '
                     f'{BACKGROUNDS}')
  grey = np.clip(np.round(value), 0, 255).astype(np.uint8)
  return np.repeat(grey[:, :, None], 3, axis=2)


def object_centres(obj: SceneObject, times_s: np.ndarray, spec: WorldSpec
                   ) -> tuple[np.ndarray, np.ndarray]:
  """Centre (x, y) in pixels at `times_s`, wrapped into the frame."""
  dx, dy = MOTIONS[obj.motion]
  x = np.mod(obj.x0 + dx * obj.speed * times_s, spec.width)
  y = np.mod(obj.y0 + dy * obj.speed * times_s, spec.height)
  return x, y


def _object_mask(obj: SceneObject, times_s: np.ndarray, spec: WorldSpec
                 ) -> np.ndarray:
  """bool [n, H, W]: pixels whose centre lies inside the shape."""
  cx, cy = object_centres(obj, times_s, spec)
  px = np.arange(spec.width) + 0.5
  py = np.arange(spec.height) + 0.5
  # Offsets on the torus, so an object leaving one edge enters the opposite.
  w, h = spec.width, spec.height
  dx = (np.mod(px[None, :] - cx[:, None] + w / 2, w) - w / 2)[:, None, :]
  dy = (np.mod(py[None, :] - cy[:, None] + h / 2, h) - h / 2)[:, :, None]
  r = obj.size / 2
  if obj.shape == 'circle':
    return dx * dx + dy * dy <= r * r
  if obj.shape == 'square':
    half = 0.85 * r  # roughly the circle's area
    return (np.abs(dx) <= half) & (np.abs(dy) <= half)
  if obj.shape == 'triangle':
    # Apex up at dy = -r, base at dy = +r with half-width r.
    return (dy >= -r) & (dy <= r) & (np.abs(dx) <= 0.5 * (dy + r))
  if obj.shape == 'cross':
    arm = r / 3
    adx, ady = np.abs(dx), np.abs(dy)
    return ((adx <= arm) & (ady <= r)) | ((ady <= arm) & (adx <= r))
  raise ValueError(f'unknown shape {obj.shape!r}; expected one of {SHAPES}')


def render_frames(scene: Scene, times_s: Sequence[float] | np.ndarray,
                  spec: WorldSpec) -> np.ndarray:
  """uint8 [len(times_s), H, W, 3]: the scene at the given times (seconds)."""
  times_s = np.asarray(times_s, dtype=np.float64).reshape(-1)
  frames = np.broadcast_to(_background_image(scene.background, spec),
                           (len(times_s), spec.height, spec.width, 3)).copy()
  for obj in scene.objects:
    frames[_object_mask(obj, times_s, spec)] = COLOURS[obj.colour]
  return frames


# ---------------------------------------------------------------- audio
def _hash_uniform(key: int, index: np.ndarray) -> np.ndarray:
  """Uniform [0, 1) values addressed by index (SplitMix64 finalizer).

  Counter-based, so the result depends only on (key, index): no RNG state,
  identical on every platform and numpy version.
  """
  z = index.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(key)
  z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
  z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
  z = z ^ (z >> np.uint64(31))
  return (z >> np.uint64(11)).astype(np.float64) * (2.0 ** -53)


@functools.lru_cache(maxsize=1)
def _noise_table() -> np.ndarray:
  """Read-only white noise in [-1, 1), float64 [_NOISE_TABLE_LEN].

  Noise tracks read it at a per-clip offset, which is ~10x cheaper than
  hashing every sample; a 4 s repeat is inaudible in bursts and the floor.
  """
  table = 2 * _hash_uniform(0x5DEECE66D, np.arange(_NOISE_TABLE_LEN)) - 1
  table.setflags(write=False)
  return table


def _noise(key: int, index: np.ndarray) -> np.ndarray:
  return _noise_table()[np.mod(index + key % _NOISE_TABLE_LEN,
                               _NOISE_TABLE_LEN)]


def _edge_ramp(tau: np.ndarray, length: float) -> np.ndarray:
  """1 inside [0, length], ramping linearly to 0 over _FADE_S at both ends."""
  return np.clip(np.minimum(tau, length - tau) / _FADE_S, 0.0, 1.0)


def _synthesize(sound: Sound, index: np.ndarray, spec: WorldSpec
                ) -> np.ndarray:
  """float64 waveform at absolute sample indices `index` (block-aligned)."""
  sr = spec.sample_rate
  floor = spec.audio_noise_floor * _noise(sound.noise_key >> 32, index)
  t = (index - sound.onset) / sr  # seconds since onset
  active = t >= 0
  if sound.kind == 'silence':
    return floor
  if sound.kind == 'tone':
    wave = np.sin(2 * math.pi * sound.freq * t + sound.phase)
    wave *= np.clip(t / 0.01, 0.0, 1.0)  # 10 ms fade-in
  elif sound.kind == 'chirp':
    tau = np.mod(t, sound.period_s)
    rate = (sound.freq_end - sound.freq) / sound.period_s
    wave = np.sin(2 * math.pi * (sound.freq * tau + 0.5 * rate * tau * tau))
    wave *= _edge_ramp(tau, sound.period_s)
  elif sound.kind == 'noise':
    tau = np.mod(t, sound.period_s)
    wave = _noise(sound.noise_key, index)
    wave *= _edge_ramp(tau, sound.length_s)
  elif sound.kind == 'drum':
    tau = np.mod(t, sound.period_s)
    wave = np.exp(-tau / sound.length_s) * np.sin(2 * math.pi * sound.freq *
                                                  tau)
  else:
    raise ValueError(f'unknown sound {sound.kind!r}; expected one of {SOUNDS}')
  return floor + sound.level * np.where(active, wave, 0.0)


def render_audio(scene: Scene, start_sample: int, num_samples: int,
                 spec: WorldSpec) -> np.ndarray:
  """float32 [num_samples] in [-1, 1], samples start..start+num of the track.

  Samples past the clip's end are rendered like any other (the world is
  defined for all t >= 0); callers clip to `spec.num_samples` themselves.
  """
  if start_sample < 0 or num_samples < 0:
    raise ValueError(f'render_audio: start_sample and num_samples must be '
                     f'>= 0, got {start_sample}, {num_samples}')
  lo = (start_sample // _AUDIO_BLOCK) * _AUDIO_BLOCK
  hi = -(-(start_sample + num_samples) // _AUDIO_BLOCK) * _AUDIO_BLOCK
  index = np.arange(lo, hi, dtype=np.int64)
  wave = _synthesize(scene.sound, index, spec)
  out = wave[start_sample - lo:start_sample - lo + num_samples]
  return np.clip(out, -1.0, 1.0).astype(np.float32)
