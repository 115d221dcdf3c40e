"""Training driven by evaluation: model selection, reduce-on-plateau, early stopping.

    config.eval.select = ("test/t2v_R@1", "max")   # "<evaluator>/<metric>", max|min
    config.eval.keep_best = 1                      # best-N checkpoints, beside the latest-N
    config.eval.plateau.factor = 0.1               # None: off
    config.eval.plateau.patience = 2
    config.eval.plateau.cooldown = 3
    config.eval.plateau.min_lr = 0.0
    config.eval.plateau.threshold = 1e-4
    config.eval.early_stopping_patience = 10       # None: off

Reduce-on-plateau follows PyTorch's `ReduceLROnPlateau` (mode max/min,
relative threshold), which COOT trains with (factor 0.1, patience 2,
cooldown 3) and MMT too: after each evaluation of the selected metric,
  improved  = v > best * (1 + threshold)   (max; min: v < best * (1 - threshold))
  bad_evals = 0 if improved else bad_evals + 1;  in cooldown: cooldown -= 1, bad_evals = 0
  bad_evals > patience:  lr_scale = max(lr_scale * factor, min_lr / base lr),
                         cooldown = cooldown_evals, bad_evals = 0.
The scale multiplies every update (the same as scaling the learning rate of
SGD and Adam(W), decay included) on top of the configured schedule.

Early stopping follows XML (TVRetrieval's train loop): an evaluation whose
metric is strictly better than the best so far resets the count of stale
evaluations; training stops once that count exceeds `early_stopping_patience`
(XML: 10). The same strict "best so far" picks the best checkpoints.

All counters live in `EvalControl`, a part of the checkpointed train state, so
a run killed at any point and re-run behaves exactly as an uninterrupted one.
"""
import dataclasses
import math
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections

from avtext.train import config_rules


@flax.struct.dataclass
class EvalControl:
  best: jax.Array  # float32: best selected metric so far (strict; -inf/+inf before any)
  stale_evals: jax.Array  # int32: evaluations since `best` last improved
  plateau_best: jax.Array  # float32: best with the plateau threshold (PyTorch's `best`)
  bad_evals: jax.Array  # int32: PyTorch's num_bad_epochs
  cooldown: jax.Array  # int32: evaluations left in cooldown
  lr_scale: jax.Array  # float32: product of the plateau reductions so far
  stopped: jax.Array  # bool: early stopping fired


selection = config_rules.selection  # (metric key, "max"|"min") of config.eval.select, or None


def plateau_enabled(config: ml_collections.ConfigDict) -> bool:
  return bool(config.get("eval", {}).get("plateau", {}).get("factor"))


def init(config: ml_collections.ConfigDict) -> EvalControl:
  select = selection(config)
  if (plateau_enabled(config) or config.get("eval", {}).get("early_stopping_patience")) \
      and select is None:
    raise ValueError("config.eval.plateau / early_stopping_patience need config.eval.select")
  worst = -math.inf if select is None or select[1] == "max" else math.inf
  f32, i32 = (lambda v: jnp.asarray(v, jnp.float32)), (lambda v: jnp.asarray(v, jnp.int32))
  return EvalControl(best=f32(worst), stale_evals=i32(0), plateau_best=f32(worst),
                     bad_evals=i32(0), cooldown=i32(0), lr_scale=f32(1.0),
                     stopped=jnp.asarray(False))


def update(control: EvalControl, value: float,
           config: ml_collections.ConfigDict) -> tuple[EvalControl, dict[str, Any]]:
  """The control after an evaluation of the selected metric gave `value`.

  Returns (new control, events): events["improved"] (a new best: save a best
  checkpoint), ["reduced"] (the learning-rate scale dropped), ["stop"].
  """
  _, mode = selection(config)
  host = jax.device_get(control)
  c = {f.name: getattr(host, f.name).item() for f in dataclasses.fields(host)}
  sign = 1.0 if mode == "max" else -1.0
  value = float(value)
  if math.isnan(value):
    raise ValueError(f"config.eval.select: {selection(config)[0]} is NaN")
  events = {"improved": sign * value > sign * c["best"], "reduced": False, "stop": False}
  if events["improved"]:
    c["best"], c["stale_evals"] = value, 0
  else:
    c["stale_evals"] += 1

  if plateau_enabled(config):
    p = config.eval.plateau
    threshold = p.get("threshold", 1e-4)
    better = (value > c["plateau_best"] * (1 + threshold) if mode == "max"
              else value < c["plateau_best"] * (1 - threshold))
    if better:
      c["plateau_best"], c["bad_evals"] = value, 0
    else:
      c["bad_evals"] += 1
    if c["cooldown"] > 0:
      c["cooldown"] -= 1
      c["bad_evals"] = 0
    if c["bad_evals"] > p.get("patience", 0):
      floor = p.get("min_lr", 0.0) / config.optimizer.learning_rate
      scale = max(c["lr_scale"] * p.factor, floor)
      if c["lr_scale"] - scale > 1e-12:
        c["lr_scale"], events["reduced"] = scale, True
      c["cooldown"], c["bad_evals"] = p.get("cooldown", 0), 0

  patience = config.eval.get("early_stopping_patience")
  if patience and c["stale_evals"] > patience:
    c["stopped"], events["stop"] = True, True
  return EvalControl(**{k: jnp.asarray(v, getattr(host, k).dtype) for k, v in c.items()}), events
