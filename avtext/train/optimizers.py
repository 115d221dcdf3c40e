"""optax optimizers and learning-rate schedules from `config.optimizer`.

    optimizer.name: 'sgd' (momentum, nesterov) | 'adam' | 'adamw' | 'radam'
    optimizer.learning_rate: peak learning rate
    optimizer.weight_decay: adamw: decoupled decay (Loshchilov & Hutter);
        sgd / adam / radam: L2 added to the gradient before the update, as
        PyTorch's `weight_decay` argument of those optimizers (COOT: 2e-5 with
        Adam); 0 or unset: none
    optimizer.b1, b2, eps: Adam-family moments and epsilon (default 0.9, 0.999, 1e-8;
        COOT YouCook2's RAdam: 0.56, 0.98, 1.5e-9)
    optimizer.schedule: 'cosine' | 'constant' | 'linear' (BERT's warmup_linear:
        linear decay to 0 at the last step, after the warmup)
    optimizer.weight_decay_exclude: regexes over parameter paths that get no
        weight decay (BERT / TVCaption / TVRetrieval: biases and LayerNorm,
        (r"bias$", r"norm")); adamw only
    optimizer.warmup_epochs / warmup_steps: linear warmup from 0 (epochs win when set)
    optimizer.grad_clip_norm: global-norm clipping when > 0
    optimizer.grad_clip_per_tensor: when > 0, each parameter tensor's gradient is
        clipped to this norm on its own (BertAdam's max_grad_norm: TVCaption,
        TVRetrieval)
    optimizer.frozen: regexes over parameter paths ("text/encoderblock_0/...")
        that are neither differentiated nor updated (see `split_frozen`)
    optimizer.lr_multipliers: ((regex, factor), ...); a parameter's update
        (the whole step, weight decay included, as a per-group learning rate
        in other frameworks) is scaled by the factor of the first regex that
        matches its path; unmatched parameters use 1
"""
import re
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import optax


# The names config.optimizer.name and config.optimizer.schedule take.
OPTIMIZERS = ("sgd", "adam", "adamw", "radam")
SCHEDULES = ("cosine", "constant", "linear")


def learning_rate_schedule(opt: ml_collections.ConfigDict, total_steps: int,
                           steps_per_epoch: int) -> optax.Schedule:
  """Linear warmup then the named decay; VideoCC: cosine, 1.5-epoch warmup."""
  warmup = opt.get("warmup_steps", 0) or 0
  if opt.get("warmup_epochs"):
    warmup = int(round(opt.warmup_epochs * steps_per_epoch))
  warmup = min(warmup, max(total_steps - 1, 0))
  peak = opt.learning_rate
  name = opt.get("schedule", "cosine")
  if name == "cosine":
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=peak, warmup_steps=warmup,
        decay_steps=max(total_steps, warmup + 1), end_value=0.0)
  if name == "linear":
    decay = max(total_steps - warmup, 1)
    return optax.join_schedules(
        [optax.linear_schedule(0.0, peak, warmup), optax.linear_schedule(peak, 0.0, decay)],
        [warmup])
  if name == "constant":
    if not warmup:
      return optax.constant_schedule(peak)
    return optax.join_schedules(
        [optax.linear_schedule(0.0, peak, warmup), optax.constant_schedule(peak)],
        [warmup])
  raise ValueError(f"config.optimizer.schedule={name!r}; expected one of {', '.join(SCHEDULES)}")


def _base(opt: ml_collections.ConfigDict, lr: optax.Schedule) -> optax.GradientTransformation:
  name = opt.name
  adam_args = dict(b1=opt.get("b1", 0.9), b2=opt.get("b2", 0.999), eps=opt.get("eps", 1e-8))
  exclude = opt.get("weight_decay_exclude") or ()
  if exclude and name != "adamw":
    raise ValueError(f"config.optimizer.weight_decay_exclude is for adamw, not {name!r}")
  if name == "adamw":
    mask = None
    if exclude:
      compiled = [re.compile(p) for p in exclude]

      def mask(params):
        _require_matches(params, zip(exclude, compiled), "config.optimizer.weight_decay_exclude",
                         "trainable parameter")
        return jax.tree_util.tree_map_with_path(
            lambda path, _: not any(r.search(path_name(path)) for r in compiled), params)
    return optax.adamw(lr, weight_decay=opt.get("weight_decay", 0.01), mask=mask, **adam_args)
  if name == "sgd":
    tx = optax.sgd(lr, momentum=opt.get("momentum", 0.9) or None,
                   nesterov=opt.get("nesterov", False))
  elif name == "adam":
    tx = optax.adam(lr, **adam_args)
  elif name == "radam":
    tx = optax.radam(lr, **adam_args)
  else:
    raise ValueError(f"config.optimizer.name={name!r}; expected one of {', '.join(OPTIMIZERS)}")
  l2 = opt.get("weight_decay") or 0.0
  # PyTorch's coupled weight decay: g <- g + wd * p before the optimizer sees g.
  return optax.chain(optax.add_decayed_weights(l2), tx) if l2 else tx


def path_name(path) -> str:
  """A parameter's tree path as "a/b/c" (the form config regexes and prefixes match)."""
  return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def frozen_mask(params: Any, patterns) -> Any:
  """True for parameters whose path matches any regex in `patterns`."""
  compiled = [re.compile(p) for p in patterns]
  mask = jax.tree_util.tree_map_with_path(
      lambda path, _: any(r.search(path_name(path)) for r in compiled), params)
  _require_matches(params, zip(patterns, compiled), "config.optimizer.frozen", "parameter")
  return mask


def _require_matches(params: Any, named_regexes, field: str, what: str) -> None:
  """Raises naming `field` if some (pattern, regex) matches no parameter path."""
  names = [path_name(path) for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
  for pattern, regex in named_regexes:
    if not any(regex.search(n) for n in names):
      raise ValueError(f"{field}: {pattern!r} matches no {what}")


def split_frozen(params: Any, mask: Any) -> tuple[Any, Any]:
  """(trainable, frozen) trees; each has None where the other holds the leaf.

  The train step differentiates only `trainable`, so JAX never builds the
  backward pass of computation that depends on frozen parameters alone (a
  frozen lower text tower costs its forward pass only), and the optimizer
  keeps no state and applies no weight decay for frozen leaves.
  """
  trainable = jax.tree.map(lambda p, m: None if m else p, params, mask)
  frozen = jax.tree.map(lambda p, m: p if m else None, params, mask)
  return trainable, frozen


def merge_frozen(trainable: Any, frozen: Any) -> Any:
  return jax.tree.map(lambda t, f: f if t is None else t, trainable, frozen,
                      is_leaf=lambda x: x is None)


def _parse_multipliers(pairs) -> list[tuple[str, re.Pattern, float]]:
  parsed = []
  for pair in pairs or ():
    if len(pair) != 2:
      raise ValueError(f"config.optimizer.lr_multipliers: expected (regex, factor) pairs, "
                       f"got {pair!r}")
    pattern, factor = pair
    if not float(factor) >= 0:
      raise ValueError(f"config.optimizer.lr_multipliers: factor for {pattern!r} must be "
                       f">= 0, got {factor!r}")
    parsed.append((pattern, re.compile(pattern), float(factor)))
  return parsed


def scale_by_path(pairs) -> optax.GradientTransformation:
  """Multiplies each update by the factor of the first matching (regex, factor) pair.

  The factors are resolved from parameter paths at trace time, so this keeps no
  state; `init` checks that every regex matches some parameter.
  """
  parsed = _parse_multipliers(pairs)

  def factor(path) -> float:
    name = path_name(path)
    return next((f for _, r, f in parsed if r.search(name)), 1.0)

  def init_fn(params):
    _require_matches(params, [(p, r) for p, r, _ in parsed], "config.optimizer.lr_multipliers",
                     "trainable parameter")
    return optax.EmptyState()

  def update_fn(updates, state, params=None):
    del params
    return jax.tree_util.tree_map_with_path(lambda p, u: u * factor(p), updates), state

  return optax.GradientTransformation(init_fn, update_fn)


def make_optimizer(opt: ml_collections.ConfigDict, *, total_steps: int,
                   steps_per_epoch: int) -> tuple[optax.GradientTransformation, Callable]:
  """Returns (transformation, schedule); the schedule is logged as `lr`.

  The transformation applies to the trainable parameters only (`split_frozen`).
  """
  schedule = learning_rate_schedule(opt, total_steps, steps_per_epoch)
  tx = _base(opt, schedule)
  if opt.get("lr_multipliers"):
    tx = optax.chain(tx, scale_by_path(opt.lr_multipliers))
  if opt.get("grad_clip_per_tensor"):
    tx = optax.chain(clip_per_tensor(float(opt.grad_clip_per_tensor)), tx)
  if opt.get("grad_clip_norm"):
    tx = optax.chain(optax.clip_by_global_norm(opt.grad_clip_norm), tx)
  return tx, schedule


def clip_per_tensor(max_norm: float) -> optax.GradientTransformation:
  """g * min(1, max_norm / ||g||) for every leaf separately (BertAdam's clipping)."""

  def update_fn(updates, state, params=None):
    del params

    def clip(g):
      norm = jnp.sqrt(jnp.sum(jnp.square(g.astype(jnp.float32))))
      return (g * jnp.minimum(1.0, max_norm / jnp.maximum(norm, 1e-30))).astype(g.dtype)
    return jax.tree.map(clip, updates), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)
