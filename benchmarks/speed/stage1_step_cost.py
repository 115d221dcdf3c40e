r"""Train-step time of the demo's RGB tower variants (stage 1), relative to the pure ViT.

    JAX_PLATFORMS=cpu python -m benchmarks.speed.stage1_step_cost [--rounds=8]

The stage-1 model of configs/synthetic_video_pretrain.py (4-layer d=128 MBT RGB tower on
4 x 64 x 64 frames, 2x8x8 tubelets, linear head on 26 labels, sigmoid loss, adamw) at
batch 64, one jitted step per variant: the pure patch embedding (the demo), the conv stem
(`rgb_stem=(32, 64)`) and the `hybrid` variant (stem + max-pooled tokens + LayerScale).
The variants run interleaved, 3 steps each per round, so a shared machine's load falls on
all of them alike: the ratios hold where the absolute times do not. --quick: one round.
Rows: each variant's median step time and its ratio to the pure ViT's.
"""
import time

from absl import flags
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from avtext.models import mbt
from benchmarks import common

_ROUNDS = flags.DEFINE_integer("rounds", 8, "interleaved rounds of 3 steps per variant")

VARIANTS = {
    "pure (the demo)": {},
    "rgb_stem=(32, 64)": dict(rgb_stem=(32, 64)),
    "hybrid (stem + max + LayerScale 0.1)": dict(rgb_stem=(32, 64), rgb_pool="max",
                                                 layer_scale=0.1),
}


class _Classifier(nn.Module):
  tower: dict

  @nn.compact
  def __call__(self, x):
    embedding = mbt.MBT(modalities="rgb", hidden_size=128, num_layers=4, num_heads=4,
                        mlp_dim=256, rgb_patch_size=(2, 8, 8),
                        demo=mbt.DemoOptions(**self.tower))(
                            {"rgb": x}, train=True)["embedding"]
    return nn.Dense(26)(embedding)


def _step_fn(tower):
  model = _Classifier(tower)
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(64, 4, 64, 64, 3)), jnp.float32)
  y = jnp.asarray(rng.integers(0, 2, size=(64, 26)), jnp.float32)
  params = model.init(jax.random.PRNGKey(0), x)
  tx = optax.adamw(1e-3)

  @jax.jit
  def step(params, opt_state):
    loss = lambda p: optax.sigmoid_binary_cross_entropy(model.apply(p, x), y).sum(-1).mean()  # noqa: E731
    updates, opt_state = tx.update(jax.grad(loss)(params), opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  state = step(params, tx.init(params))  # compile
  jax.block_until_ready(state)
  return step, state


def main(argv):
  del argv
  runs = {name: list(_step_fn(tower)) for name, tower in VARIANTS.items()}
  times = {name: [] for name in runs}
  rounds = 1 if common.quick() else _ROUNDS.value
  for _ in range(rounds):
    for name, run in runs.items():
      start = time.perf_counter()
      for _ in range(3):
        run[1] = run[0](*run[1])
      jax.block_until_ready(run[1])
      times[name].append((time.perf_counter() - start) / 3)
  pure = np.median(times["pure (the demo)"])
  table = f"stage-1 tower + head, batch 64, median of {rounds} interleaved rounds of 3 steps"
  for name, t in times.items():
    print(f"{name:<38} {np.median(t):6.3f} s/step   x{np.median(t) / pure:4.2f}")
    common.record("Demo stage 1 (RGB tower)", name, float(np.median(t)), unit="s",
                  table=table, column="step", digits=3)
    common.record("Demo stage 1 (RGB tower)", name, float(np.median(t) / pure), unit="x",
                  table=table, column="of the pure ViT's", digits=3)


if __name__ == "__main__":
  common.main(main)
