"""Paper-scale training options on the tiny AVR config: FSDP (params and optimizer state
sharded over `data`) and gradient accumulation over micro-batches (GradCache for the
in-batch-negative NCE). Each is checked against the plain data-parallel step: same losses,
same parameters, checkpoints readable across shardings."""
import jax
import numpy as np
import pytest

from avtext import runs
from avtext.train import partitioning
from test_models_precision import relative_difference
from test_train_trainer import _losses, make_trainer, tiny_config


def _fsdp(**overrides):
  # fsdp_min_size 1: every divisible tensor of the tiny model is sharded.
  return tiny_config(**{"partitioning.fsdp": True, "partitioning.fsdp_min_size": 1,
                        **overrides})


@pytest.mark.slow  # `make test` budget: `make test-slow` (CI runs both)
def test_fsdp_on_eight_devices_trains_like_one_device(tmp_path):
  assert jax.device_count() == 8, "tests/conftest.py must configure 8 fake devices"
  l1, s1 = _losses(tiny_config(num_devices=1), tmp_path / "one", 3)
  l8, s8 = _losses(_fsdp(num_devices=8), tmp_path / "fsdp", 3)
  np.testing.assert_allclose(l1, l8, atol=1e-5, rtol=0)
  kernel = s8.params["text"]["encoderblock_1"]["mlp"]["dense_in"]["kernel"]  # [32, 64]
  assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, "data")
  assert kernel.addressable_shards[0].data.shape == (32, 8)  # 1/8 of the tensor per device
  # The optimizer state follows its parameter (Adam's mu and nu).
  mu = s8.opt_state
  flat = {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_leaves_with_path(mu)}
  sharded = [k for k, x in flat.items() if k.endswith("['dense_in']['kernel']")
             and "encoderblock_1" in k and "text" in k]
  assert sharded and all(flat[k].sharding.spec == kernel.sharding.spec for k in sharded)
  # Adam turns float noise in near-zero gradients (attention key biases) into full-size
  # updates, so parameters are compared as whole trees.
  assert relative_difference(s8.params, s1.params) < 1e-4


@pytest.mark.slow  # ~33 s; FSDP training itself stays in the default run
def test_fsdp_checkpoint_opens_replicated_and_resumes_replicated(tmp_path):
  config = _fsdp(num_devices=8, **{"train.num_steps": 5})
  state = make_trainer(config, tmp_path / "run").train()
  run = runs.load_run(tmp_path / "run")  # one device, no mesh
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(run.variables["params"])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # ...and the other way: a data-parallel run resumes the FSDP run's checkpoint.
  plain = tiny_config(num_devices=8, **{"train.num_steps": 5})
  resumed, _, _ = make_trainer(plain, tmp_path / "run").restore_or_init()
  assert int(resumed.step) == 5
  kernel = resumed.params["text"]["encoderblock_1"]["mlp"]["dense_in"]["kernel"]
  assert kernel.sharding.is_fully_replicated
  np.testing.assert_array_equal(
      np.asarray(kernel), np.asarray(state.params["text"]["encoderblock_1"]["mlp"]
                                     ["dense_in"]["kernel"]))


@pytest.mark.parametrize("microbatches", [pytest.param(2, marks=pytest.mark.slow), 4])
def test_microbatches_give_the_full_batch_step(tmp_path, microbatches):
  # Batch 8 on 2 devices: micro-batches of 4 or 2, each split over both devices. The tiny
  # config has no dropout, so the micro-batches' dropout keys do not matter.
  plain, s_plain = _losses(tiny_config(num_devices=2), tmp_path / "plain", 3)
  micro, s_micro = _losses(tiny_config(num_devices=2, **{"train.microbatches": microbatches}),
                           tmp_path / "micro", 3)
  np.testing.assert_allclose(plain, micro, rtol=1e-5)
  assert relative_difference(s_micro.params, s_plain.params) < 1e-4


def test_microbatches_must_divide_the_batch_and_the_task_must_split(tmp_path):
  with pytest.raises(ValueError, match="config.train.microbatches=3"):
    make_trainer(tiny_config(num_devices=1, **{"train.microbatches": 3}),
                 tmp_path)._microbatches()  # pylint: disable=protected-access
  run = make_trainer(tiny_config(num_devices=1, **{"train.microbatches": 2}), tmp_path)
  run.task.encode = None
  with pytest.raises(ValueError, match="no encode/combine split"):
    run._microbatches()  # pylint: disable=protected-access
  assert partitioning.num_data_shards(run.mesh) == 1
