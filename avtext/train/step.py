"""The train step: `TrainState` and the jitted, sharded, donated update of one batch.

    new_state, metrics = train_step(state, batch)

The loss and its gradient with respect to the trainable params (`config.optimizer.frozen`
excluded), on the whole batch or, with `config.train.microbatches` = k, by GradCache over
k micro-batches; then the optimizer update, scaled by reduce-on-plateau's learning-rate
factor (`control.py`). `Trainer.make_train_step` builds it for a run; `avtext.aot` and
the step benchmarks lower the same function.
"""
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax

from avtext.train import control as control_lib
from avtext.train import optimizers
from avtext.train import partitioning


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # number of completed updates
  params: Any
  model_state: Any  # non-param flax collections, e.g. {"batch_stats": ...}; {} if none
  opt_state: Any
  rng: jax.Array  # base key; step keys are fold_in(rng, step)
  control: control_lib.EvalControl  # best metric, plateau and early-stopping counters


def as_variables(params, model_state) -> dict:
  """{"params": ..., **non-param collections}: what `model.apply` takes."""
  return {"params": params, **model_state}


def make_train_step(task, config, mesh, *, frozen_mask, tx, schedule, state_sharding,
                    microbatches: int = 1):
  """jit(train_step) with `state` donated: `task`'s loss (`loss_fn`, or `encode` +
  `combine` when `microbatches` > 1) on `mesh`, `tx` masked by `frozen_mask`."""
  plateau = control_lib.plateau_enabled(config)

  def loss_of_trainable(trainable, frozen, model_state, batch, rng, step):
    variables = as_variables(optimizers.merge_frozen(trainable, frozen), model_state)
    extra = {"step": step} if getattr(task, "loss_needs_step", False) else {}
    loss, metrics, new_model_state = task.loss_fn(variables, batch, rng, **extra)
    return loss, (metrics, new_model_state)

  micro_sharding = jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec(None, partitioning.DATA_AXIS))

  def split(x):  # [B, ...] -> [k, B/k, ...]; micro-batch i = examples i, i + k, ...
    x = x.reshape((x.shape[0] // microbatches, microbatches) + x.shape[1:])
    return jax.lax.with_sharding_constraint(jnp.swapaxes(x, 0, 1), micro_sharding)

  def join(x):  # inverse of split
    return jnp.swapaxes(x, 0, 1).reshape((-1,) + x.shape[2:])

  def grad_of_microbatches(trainable, frozen, model_state, batch, rng, step):
    """GradCache: features of k micro-batches (forward only), the loss and its gradient
    with respect to the features on the whole batch, then each micro-batch's
    vector-Jacobian product with its slice of that gradient: the full batch's
    gradient at the activation memory of one micro-batch (the model runs forward twice).
    Micro-batch i draws its dropout from fold_in(rng, i). Non-param collections
    (BatchNorm statistics) are updated micro-batch after micro-batch, and BatchNorm
    normalizes each micro-batch by its own statistics."""
    extra = {"step": step} if getattr(task, "loss_needs_step", False) else {}
    micro = jax.tree.map(split, batch)
    index = jnp.arange(microbatches)

    def features(params, collections, mb, i):
      variables = as_variables(optimizers.merge_frozen(params, frozen), collections)
      return task.encode(variables, mb, jax.random.fold_in(rng, i), **extra)

    def forward(collections, xs):
      feats, new = features(trainable, collections, *xs)
      return {**collections, **new}, feats

    new_model_state, feats = jax.lax.scan(forward, model_state, (micro, index))
    (loss, aux), dfeats = jax.value_and_grad(
        lambda f: task.combine(f, batch, **extra), has_aux=True)(jax.tree.map(join, feats))

    def backward(carry, xs):
      acc, collections = carry
      mb, i, df = xs
      _, pull, new = jax.vjp(lambda p: features(p, collections, mb, i), trainable,
                             has_aux=True)
      acc = jax.tree.map(jnp.add, acc, pull(df)[0])
      return (acc, {**collections, **new}), None

    zeros = jax.tree.map(jnp.zeros_like, trainable)
    (grads, _), _ = jax.lax.scan(backward, (zeros, model_state),
                                 (micro, index, jax.tree.map(split, dfeats)))
    return (loss, (aux, new_model_state)), grads

  def train_step(state: TrainState, batch):
    rng = jax.random.fold_in(state.rng, state.step)
    trainable, frozen = optimizers.split_frozen(state.params, frozen_mask)
    if microbatches > 1:
      (loss, (aux, new_model_state)), grads = grad_of_microbatches(
          trainable, frozen, state.model_state, batch, rng, state.step)
    else:
      (loss, (aux, new_model_state)), grads = jax.value_and_grad(
          loss_of_trainable, has_aux=True)(trainable, frozen, state.model_state, batch,
                                           rng, state.step)
    updates, opt_state = tx.update(grads, state.opt_state, trainable)
    lr = schedule(state.step)
    if plateau:  # reduce-on-plateau scales every update (control.py)
      updates = jax.tree.map(lambda u: u * state.control.lr_scale, updates)
      lr = lr * state.control.lr_scale
    params = optimizers.merge_frozen(optax.apply_updates(trainable, updates), frozen)
    metrics = {"loss": loss, "grad_norm": optax.global_norm(grads), "lr": lr, **aux}
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                              model_state={**state.model_state, **new_model_state})
    return new_state, metrics

  return jax.jit(
      train_step,
      in_shardings=(state_sharding, partitioning.data_sharding(mesh)),
      out_shardings=(state_sharding, partitioning.replicated(mesh)),
      donate_argnums=(0,))
