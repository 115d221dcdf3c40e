r"""Stage-1 recipes for the demo's RGB tower, compared on the same pre-rendered clips.

    python -m benchmarks.tables.stage1_recipes --loss=group_softmax_xent \
        --shape_weight=5 --rgb_pool=max --layer_scale=0.1 --batch=8 --steps=2400

The model, loss and metrics are avtext's: configs/synthetic_video_pretrain.py's model and
loss with the flags' overrides (`models.model_registry.build_model`, `tasks.classification.
group_loss`, `metrics.classification`); only the data path is simpler than `avtext.main`'s: `--num_train`
train clips of the synthetic world (4 frames at stride 8 from a random start, as the
demo samples them) are rendered once into memory, and test accuracy is on the centre clip
of each of the 1000 test videos (`avtext.main` averages 4 clips). So a recipe costs its
steps and nothing else, and recipes are compared on identical data. Prints one line:
the recipe, its training time and the test accuracy per attribute (sound excluded: the
tower has no audio). --quick: 64 train clips, 100 test videos, 5 steps. Rows: the recipe's
accuracy per attribute.
"""
import multiprocessing
import time

from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
import optax

from avtext.losses import classification as losses
from avtext.metrics import classification as metrics
from avtext.models import model_registry
from avtext.tasks import classification
from avworld import clips
from avworld import world
from benchmarks import common

_LOSS = flags.DEFINE_enum("loss", "group_softmax_xent", ["sigmoid_xent", "group_softmax_xent"],
                          "stage-1 objective")
_SHAPE_WEIGHT = flags.DEFINE_float("shape_weight", 5.0, "group_softmax_xent: shape's weight")
_FOCAL = flags.DEFINE_float("focal_gamma", 0.0, "group_softmax_xent: focal exponent")
_POOL = flags.DEFINE_enum("rgb_pool", "max", ["cls", "max"], "MBT rgb_pool")
_LAYER_SCALE = flags.DEFINE_float("layer_scale", 0.1, "MBT layer_scale (0: off)")
_STEM = flags.DEFINE_list("rgb_stem", [], "MBT rgb_stem channel widths (empty: none)")
_BATCH = flags.DEFINE_integer("batch", 8, "clips per step")
_STEPS = flags.DEFINE_integer("steps", 2400, "train steps (adamw 1e-3, 50 warmup, cosine)")
_NUM_TRAIN = flags.DEFINE_integer("num_train", 40000, "train clips rendered")
_SEED = flags.DEFINE_integer("seed", 0, "init and sampling seed")

_MEAN = np.array([0.485, 0.456, 0.406], np.float32)  # as avtext.data.video
_STD = np.array([0.229, 0.224, 0.225], np.float32)
_NUM_FRAMES, _STRIDE = 4, 8


def _render(args):
  split, index = args
  spec = world.WorldSpec()
  source = clips.ClipCaptionSource(split)
  span = spec.num_frames - _NUM_FRAMES * _STRIDE
  start = (np.random.default_rng(index).integers(0, span) if split == "train" else span // 2)
  frames = source.render_frames(index, start + _STRIDE * np.arange(_NUM_FRAMES))
  return frames, world.attribute_labels(source.describe(index)["attributes"])


def _clips(split: str, n: int) -> tuple[np.ndarray, np.ndarray]:
  with multiprocessing.Pool(2) as pool:
    out = pool.map(_render, [(split, i) for i in range(n)], chunksize=256)
  return np.stack([o[0] for o in out]), np.stack([o[1] for o in out])


def _normalize(x: np.ndarray) -> jax.Array:
  return jnp.asarray((x.astype(np.float32) / 255 - _MEAN) / _STD)


def main(argv):
  del argv
  num_train, num_test, steps = ((64, 100, 5) if common.quick() else
                                (_NUM_TRAIN.value, 1000, _STEPS.value))
  x, y = _clips("train", num_train)
  test_x, test_y = _clips("test", num_test)
  config = common.load_config("configs/synthetic_video_pretrain.py")
  tower = config.model.video
  tower.rgb_pool, tower.layer_scale = _POOL.value, _LAYER_SCALE.value
  tower.rgb_stem = tuple(int(c) for c in _STEM.value)
  config.loss.name, config.loss.focal_gamma = _LOSS.value, _FOCAL.value
  config.loss.group_weights.shape = _SHAPE_WEIGHT.value
  model = model_registry.build_model(config.model)
  if _LOSS.value == "sigmoid_xent":
    loss_fn = losses.sigmoid_cross_entropy
  else:
    loss_fn = classification.group_loss(config.loss, world.LABEL_NAMES)
  params = model.init(jax.random.PRNGKey(_SEED.value), {"rgb": _normalize(x[:2])})
  schedule = optax.warmup_cosine_decay_schedule(0.0, 1e-3, min(50, steps // 2), steps)
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01))
  opt_state = tx.init(params)

  @jax.jit
  def step(params, opt_state, batch_x, batch_y):
    loss = lambda p: loss_fn(model.apply(p, {"rgb": batch_x}, train=True), batch_y)  # noqa: E731
    updates, opt_state = tx.update(jax.grad(loss)(params), opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  rng = np.random.default_rng(_SEED.value)
  start = time.perf_counter()
  for _ in range(steps):
    idx = rng.integers(0, len(x), _BATCH.value)
    params, opt_state = step(params, opt_state, _normalize(x[idx]), jnp.asarray(y[idx]))
  jax.block_until_ready(params)
  seconds = time.perf_counter() - start
  predict = jax.jit(lambda p, v: model.apply(p, {"rgb": v}))
  logits = np.concatenate([np.asarray(predict(params, _normalize(test_x[i:i + 100])))
                           for i in range(0, len(test_x), 100)])
  result = metrics.classification_metrics(logits, test_y, world.LABEL_NAMES)
  recipe = (f"loss={_LOSS.value} shape_weight={_SHAPE_WEIGHT.value} "
            f"focal_gamma={_FOCAL.value} rgb_pool={_POOL.value} "
            f"layer_scale={_LAYER_SCALE.value} rgb_stem={tuple(tower.rgb_stem)} "
            f"{steps} x {_BATCH.value}")
  accuracy = " ".join(f"{g} {result[g + '_accuracy']:.1f}"
                      for g in ("shape", "colour", "count", "motion", "background"))
  print(f"{recipe}: train {seconds:.0f} s; test accuracy {accuracy}")
  table = (f"{num_train:,} pre-rendered train clips, the centre clip of {num_test} test "
           "videos: test accuracy")
  label = (f"{'sigmoid' if _LOSS.value == 'sigmoid_xent' else 'group softmax'}"
           + (f", shape x{_SHAPE_WEIGHT.value:g}" if _LOSS.value != "sigmoid_xent" else "")
           + (f", focal gamma {_FOCAL.value:g}" if _FOCAL.value else "")
           + f", {'max' if _POOL.value == 'max' else '[CLS]'}"
           + (f", LayerScale {_LAYER_SCALE.value:g}" if _LAYER_SCALE.value else "")
           + (f", conv stem {tuple(tower.rgb_stem)}" if tower.rgb_stem else "")
           + f", {steps} x {_BATCH.value}")
  for group in ("shape", "colour", "count", "motion", "background"):
    common.record("Demo stage 1 (RGB tower)", label, result[group + "_accuracy"], unit="%",
                  table=table, column=group, digits=3)


if __name__ == "__main__":
  common.main(main)
