"""Image embedders for mining: f(x) of VideoCC §3.1, uint8 frames [N, H, W, 3] -> float32
[N, D], rows L2-normalized so that the dot product is a cosine and τ is on its scale.

Named by a string, so a Beam worker can build its own copy (`resolve`):

  run:DIR[@STEP]        the vision tower of an avtext run directory (its config's
                        model.video, e.g. configs/synthetic_video_pretrain.py) on single
                        frames: each frame is repeated into a still clip of the tower's
                        `data.num_frames` frames, resized and normalized as in training,
                        and the [CLS] embedding is taken. The synthetic default: the RGB
                        tower `make demo` pretrains to recognize the world's shapes,
                        colours, motions and backgrounds, which is what a caption says,
                        as Graph-RISE (the paper's f) is trained for semantic image
                        similarity rather than pixel similarity.
  callable:MODULE:NAME  any Python callable `frames -> [N, D]` (for a real corpus: a
                        CLIP / SigLIP / Graph-RISE-like model); its output is normalized
                        here unless it is already.

Never imports avtext.train's trainer or avtext.tasks: a run's tower is loaded through
`avtext.runs` (config + model registry + checkpoint).
"""
from __future__ import annotations

import importlib
from typing import Callable

import numpy as np

Embedder = Callable[[np.ndarray], np.ndarray]


def l2_normalize(x: np.ndarray) -> np.ndarray:
  x = np.asarray(x, np.float32)
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


# ------------------------------------------------------------------ centring
# A mean embedding, estimated by the pipeline from the unit vectors it already computes
# (`MiningConfig.center`), is subtracted from every seed and frame vector before the
# cosine. Row sums are kept in fixed point, integer multiples of 2^-FIXED_POINT_BITS
# held in int64: integer addition is exact, so the sum over shards is the same integers
# in every grouping and order, and the mean the same bits on every runner and sharding.
# Unit vectors have |x_i| <= 1, so int64 holds the sum of up to 2^(63-24) = 5e11 rows.
FIXED_POINT_BITS = 24


def fixed_point_sum(x: np.ndarray) -> np.ndarray:
  """int64 [D]: the column sums of x [N, D], each entry rounded to a multiple of
  2^-FIXED_POINT_BITS first (exactly associative; see above)."""
  x = np.asarray(x, np.float64)
  if x.ndim != 2:
    raise ValueError(f'fixed_point_sum: expected [N, D] vectors, got shape {x.shape}')
  return np.rint(x * 2.0 ** FIXED_POINT_BITS).astype(np.int64).sum(0)


def mean_from_sums(total: np.ndarray, count: int) -> np.ndarray:
  """float32 [D]: the mean of `count` rows whose `fixed_point_sum`s add up to `total`."""
  if count < 1:
    raise ValueError(f'mean_from_sums: no rows to average (count {count})')
  return (np.asarray(total, np.int64).astype(np.float64) / 2.0 ** FIXED_POINT_BITS
          / count).astype(np.float32)


def centre(x: np.ndarray, mean: np.ndarray | None) -> np.ndarray:
  """Unit rows of x - mean (x unchanged, as float32, when mean is None): the cosine of two
  centred vectors measures what they share beyond what every vector shares."""
  x = np.asarray(x, np.float32)
  if mean is None:
    return x
  mean = np.asarray(mean, np.float32)
  if mean.shape != x.shape[-1:]:
    raise ValueError(f'centre: mean of shape {mean.shape} for vectors of dimension '
                     f'{x.shape[-1]}')
  return l2_normalize(x - mean)


def tower(workdir: str, step: int | str | None = None, *, batch_size: int = 128,
          normalize: bool = True) -> Embedder:
  """A run's RGB tower on single frames (module docstring); unit rows unless `normalize`
  is False (the tower's raw output, e.g. for its classification head)."""
  from avtext.features import tower as tower_lib  # pylint: disable=g-import-not-at-top
  apply_fn, frames_per_window, _, _ = tower_lib.tower_from_run(workdir, step=step)

  def embed(frames: np.ndarray) -> np.ndarray:
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3:
      raise ValueError(f'embedder run:{workdir}: frames must be [N, H, W, 3], got '
                       f'{frames.shape}')
    out = []
    for a in range(0, len(frames), batch_size):
      x = frames[a:a + batch_size]
      # Pad the last batch to the batch size, so the tower compiles once.
      pad = batch_size - len(x)
      x = np.concatenate([x, np.repeat(x[:1], pad, 0)]) if pad else x
      clip = np.repeat(x[:, None], frames_per_window, axis=1)
      out.append(apply_fn(clip)[:batch_size - pad])
    d = out[0].shape[-1] if out else 0
    vectors = np.concatenate(out) if out else np.zeros((0, d), np.float32)
    return l2_normalize(vectors) if normalize else vectors

  return embed


def check_run(workdir: str, step: str | None = None) -> None:
  """Before any work: `workdir` can be `tower`'s run, or `errors.UserError` says why not
  (no config.json; a run without an RGB-only video tower, e.g. a captioning or
  audio-visual run; no checkpoint at `step`: None the latest, 'best' or N). A remote
  run is left to the workers."""
  import json  # pylint: disable=g-import-not-at-top
  import pathlib  # pylint: disable=g-import-not-at-top
  from avtext import errors  # pylint: disable=g-import-not-at-top
  from avtext.train import rundir  # pylint: disable=g-import-not-at-top
  if '://' in workdir:
    return
  root = pathlib.Path(workdir)
  if not (root / rundir.CONFIG_FILE).is_file():
    raise errors.InputNotFound(f'--workdir={workdir}: not an avtext run (no config.json); '
                               'train the tower first (make demo) or fix the path')
  try:
    config = json.loads((root / rundir.CONFIG_FILE).read_text())
  except (ValueError, UnicodeDecodeError) as e:
    raise errors.BadInput(f'--workdir={workdir}: its config.json is not valid JSON ({e}); '
                          f'{rundir.CONFIG_FIX}') from None
  model = config.get('model') or {}
  video = model.get('video')
  modalities = video.get('modalities', 'rgb') if isinstance(video, dict) else None
  if modalities != 'rgb':
    has = (f"a video tower on {modalities!r}" if modalities else 'no video tower')
    raise errors.BadInput(
        f"--workdir={workdir}: a {config.get('task')!r} run ({model.get('name')}) with {has}; "
        "the mining embedder needs a run whose model.video takes RGB frames alone "
        "(configs/synthetic_video_pretrain.py), or --embedder=callable:MODULE:NAME")
  folder = root / (rundir.BEST_DIR if step == 'best' else rundir.LATEST_DIR)
  steps = sorted(int(p.name) for p in folder.glob('[0-9]*') if p.name.isdigit()) \
      if folder.is_dir() else []
  if not steps:
    raise errors.InputNotFound(f'--workdir={workdir}: no checkpoint in {folder.name}/; train '
                               'the run first (re-running its command resumes it)')
  if step not in (None, 'best') and int(step) not in steps:
    raise errors.InputNotFound(f'--step={step}: {workdir} has no checkpoint at that step; '
                               f'it has {steps[-5:]}: pass one of them or leave --step out')


def resolve(name: str) -> Embedder:
  """'run:DIR[@STEP]' or 'callable:MODULE:NAME' -> an embedder (module docstring)."""
  kind, _, rest = name.partition(':')
  if kind == 'run' and rest:
    workdir, _, step = rest.partition('@')
    return tower(workdir, step=(int(step) if step.isdigit() else step) or None)
  if kind == 'callable' and ':' in rest:
    module, _, attr = rest.partition(':')
    fn = getattr(importlib.import_module(module), attr)
    return lambda frames: l2_normalize(fn(np.asarray(frames)))
  raise ValueError(f'embedder {name!r}: expected "run:DIR[@STEP]" or '
                   '"callable:MODULE:NAME"')


def colour_histogram(frames: np.ndarray, bins: int = 4) -> np.ndarray:
  """A training-free baseline f: the joint RGB histogram (bins^3), square-rooted (its dot
  product is the Bhattacharyya coefficient) and L2-normalized. Pixel statistics, not
  semantics: `callable:avtext.mining.embed:colour_histogram`."""
  x = np.asarray(frames, np.uint8)
  q = (x.astype(np.int64) * bins) // 256
  code = (q[..., 0] * bins + q[..., 1]) * bins + q[..., 2]
  flat = code.reshape(len(x), -1)
  hist = np.zeros((len(x), bins ** 3), np.float32)
  np.add.at(hist, (np.repeat(np.arange(len(x)), flat.shape[1]), flat.reshape(-1)), 1.0)
  return l2_normalize(np.sqrt(hist))
