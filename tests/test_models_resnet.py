"""ResNet (avtext/models/resnet.py): torchvision's parameter counts, BatchNorm state."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avtext.models import resnet


def _count(tree):
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))


@pytest.mark.parametrize("depth,channels,classes,expected", [
    (18, 3, 1000, 11_689_512),  # torchvision.models.resnet18().parameters()
    (34, 3, 1000, 21_797_672),
    (50, 3, 1000, 25_557_032),
    (152, 3, 1000, 60_192_808),
    (34, 1, 1000, 21_797_672 - 2 * 64 * 7 * 7),  # S-MiT's 1-channel first conv
])
def test_parameter_counts_equal_torchvision(depth, channels, classes, expected):
  model = resnet.ResNet(depth=depth, in_channels=channels, num_classes=classes)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0),
                          jnp.zeros((1, 224, 224, channels)))
  assert _count(shapes["params"]) == expected
  out = jax.eval_shape(model.apply, shapes, jnp.zeros((2, 224, 224, channels)))
  assert out["features"].shape == (2, 7, 7, 512 if depth < 50 else 2048)
  assert out["logits"].shape == (2, classes)


@pytest.mark.slow  # `make test-slow` (CI runs it): the default run's 12-minute budget
def test_batchnorm_running_stats_and_eval_mode():
  model = resnet.ResNet(depth=18, width=8, in_channels=1, stage_sizes=(1, 1, 1, 1))
  x = jax.random.normal(jax.random.PRNGKey(1), (4, 40, 32, 1)) * 3 + 1
  variables = jax.jit(model.init)(jax.random.PRNGKey(0), x)
  assert set(variables) == {"params", "batch_stats"}
  out, state = jax.jit(lambda v, x: model.apply(v, x, train=True, mutable=["batch_stats"]))(
      variables, x)
  # The stem BatchNorm's running mean moves 10 % of the way to the batch mean of conv1.
  conv1 = jax.lax.conv_general_dilated(
      x, variables["params"]["conv1"]["kernel"], (2, 2), [(3, 3), (3, 3)],
      dimension_numbers=("NHWC", "HWIO", "NHWC"))
  np.testing.assert_allclose(state["batch_stats"]["bn1"]["mean"],
                             0.1 * conv1.mean(axis=(0, 1, 2)), rtol=1e-4, atol=1e-6)
  # Eval mode uses the running statistics: the output does not depend on the batch.
  new = {"params": variables["params"], **state}
  apply = jax.jit(model.apply)
  one = apply(new, x[:1])["embedding"]
  np.testing.assert_allclose(apply(new, x)["embedding"][:1], one, rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match=r"expected input \[B, H, W, 1\]"):
    model.apply(new, jnp.zeros((1, 8, 8, 3)))


def test_resdavenet_size_and_masked_pooling():
  model = resnet.ResDAVEnet()
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 1024, 40)))
  # Hand count: input BN (2) + conv1 40x128 + BN (256); per stage c_in -> c: block 1
  # 9 c_in c + 9 c c + two BNs (4c) + projection c_in c + BN (2c) if c_in != c or
  # stride 2 (always: each stage's first block has stride 2); block 2: 18 c^2 + 4c.
  expected = 2 + 40 * 128 + 256
  for c_in, c in ((128, 128), (128, 256), (256, 512), (512, 1024)):
    expected += 9 * c_in * c + 9 * c * c + 4 * c + c_in * c + 2 * c + 18 * c * c + 4 * c
  assert _count(shapes["params"]) == expected
  out = jax.eval_shape(model.apply, shapes, jnp.zeros((2, 1024, 40)))
  assert out["features"].shape == (2, 64, 1024) and out["embedding"].shape == (2, 1024)
  # Masked mean: over the output frames whose first input frame is real (32 of 64
  # input frames -> 2 of 4 output frames).
  small = resnet.ResDAVEnet(widths=(8, 8, 8, 8, 8))
  x = jax.random.normal(jax.random.PRNGKey(2), (1, 64, 40))
  v = small.init(jax.random.PRNGKey(0), x)
  mask = jnp.arange(64)[None] < 32
  full = small.apply(v, x, mask)
  np.testing.assert_allclose(full["embedding"][0], full["features"][0, :2].mean(0), rtol=1e-5)
