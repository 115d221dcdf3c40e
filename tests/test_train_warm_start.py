"""config.init_from: parameters carried from another run's checkpoint."""
import shutil

import jax
import ml_collections
import numpy as np
import pytest

from avtext import experiment
from avtext.train import checkpointing
from avtext.train import warm_start
from tests.test_train_trainer import tiny_config
from configs import synthetic_video_pretrain  # pylint: disable=g-bad-import-order


def _tree():
  return {"video": {"rgb": {"kernel": np.zeros((2, 3), np.float32), "bias": np.zeros(3, np.float32)},
                    "audio": {"kernel": np.zeros((4,), np.float32)}},
          "text": {"kernel": np.full((5,), 7.0, np.float32)}}


def test_transplant_renames_prefix_and_leaves_the_rest():
  source = {"encoder": {"kernel": np.arange(6, dtype=np.float32).reshape(2, 3),
                        "bias": np.array([1, 2, 3], np.float32)},
            "head": {"kernel": np.ones((3, 9), np.float32)}}
  out = warm_start.transplant(_tree(), source, (("encoder", "video/rgb/"),))
  np.testing.assert_array_equal(out["video"]["rgb"]["kernel"], source["encoder"]["kernel"])
  np.testing.assert_array_equal(out["video"]["rgb"]["bias"], [1, 2, 3])
  np.testing.assert_array_equal(out["video"]["audio"]["kernel"], np.zeros(4))  # not a target
  np.testing.assert_array_equal(out["text"]["kernel"], np.full(5, 7.0))
  assert jax.tree.structure(out) == jax.tree.structure(_tree())


def test_transplant_whole_tree_with_empty_prefixes():
  source = jax.tree.map(lambda x: x + 1, _tree())
  out = warm_start.transplant(_tree(), source, (("", ""),))
  for got, want in zip(jax.tree.leaves(out), jax.tree.leaves(source)):
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("source, pairs, message", [
    ({"encoder": {"kernel": np.zeros((2, 3), np.float32)}}, (("encoder", "video/rgb"),),
     r"missing in the source: \['encoder/bias'\]"),
    ({"encoder": {"kernel": np.zeros((2, 3), np.float32), "bias": np.zeros(3, np.float32),
                  "scale": np.zeros(3, np.float32)}}, (("encoder", "video/rgb"),),
     r"not in the model: \['encoder/scale'\]"),
    ({"encoder": {"kernel": np.zeros((3, 3), np.float32), "bias": np.zeros(3, np.float32)}},
     (("encoder", "video/rgb"),), r"'encoder/kernel' is float32\(3, 3\).*'video/rgb/kernel' is "
     r"float32\(2, 3\)"),
    ({"encoder": {"kernel": np.zeros((2, 3), np.int32), "bias": np.zeros(3, np.float32)}},
     (("encoder", "video/rgb"),), r"int32"),
    ({}, (("encoder", "vision"),), r"'vision/' matches no parameter.*\['text', 'video'\]"),
    ({}, (), r"\(\(source_prefix, target_prefix\), \.\.\.\)"),
    ({}, (("a", "b", "c"),), r"source_prefix"),
])
def test_transplant_mismatches_are_errors(source, pairs, message):
  with pytest.raises(ValueError, match=message):
    warm_start.transplant(_tree(), source, pairs)


def test_missing_source_run_names_the_field(tmp_path):
  config = tiny_config()
  config.init_from = ml_collections.ConfigDict(dict(workdir=str(tmp_path / "nope"), step=None,
                                                    params=(("video", "video"),)))
  with pytest.raises(FileNotFoundError, match="config.init_from.workdir=.*nope"):
    warm_start.apply({"video": {}}, config)


@pytest.mark.slow  # default-run budget (BENCHMARKS.md, "Default test run"); `make test-slow`
def test_pretrained_rgb_tower_reaches_avr_and_resume_does_not_reread(tmp_path):
  """The demo's two stages: video_cls pretraining -> AVR with init_from (tiny sizes)."""
  source_dir, run_dir = tmp_path / "pretrain", tmp_path / "avr"
  pretrain = synthetic_video_pretrain.get_config("tiny")
  pretrain.train.num_steps = 2
  experiment.build(pretrain, source_dir).train()
  ckpt = checkpointing.Checkpointer(source_dir / "checkpoints", async_save=False)
  source_params = ckpt.restore_raw()[0]["params"]
  ckpt.close()
  assert set(source_params) == {"video", "head"} and set(source_params["video"]) == {"rgb"}

  config = tiny_config(**{"train.num_steps": 2, "train.checkpoint_every_steps": 2})
  config.init_from.workdir = str(source_dir)
  assert config.init_from.params == (("video/rgb/", "video/rgb/"),)  # the demo's mapping
  run = experiment.build(config, run_dir)
  state = run.restore_or_init()[0]
  first_batch = run.task.train_data(batch_size=config.train.batch_size, seed=config.seed,
                                    process_index=0, process_count=1)[0]
  fresh = run._init_state(first_batch, warm_start_params=False)[0].params  # pylint: disable=protected-access
  pairs = [(state.params["video"]["rgb"], source_params["video"]["rgb"])]
  pairs += [(state.params[k], fresh[k]) for k in ("text", "video_projection")]
  pairs += [(state.params["video"][k], fresh["video"][k]) for k in ("audio", "bottleneck")]
  for got_tree, want_tree in pairs:
    assert jax.tree.structure(got_tree) == jax.tree.structure(want_tree)
    for got, want in zip(jax.tree.leaves(got_tree), jax.tree.leaves(want_tree)):
      np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  assert not np.array_equal(np.asarray(fresh["video"]["rgb"]["patch_embedding"]["kernel"]),
                            source_params["video"]["rgb"]["patch_embedding"]["kernel"])

  # Train to a checkpoint, remove the source run: resuming must not need it.
  run.train()
  shutil.rmtree(source_dir)
  config.train.num_steps = 3
  resumed = experiment.build(config, run_dir).restore_or_init()[0]
  assert int(resumed.step) == 2


def test_conv_stem_tower_round_trips_through_a_checkpoint(tmp_path):
  """Stage 1's hand-over with the demo's hybrid stem (rgb_stem): a classifier's video/
  params written by the checkpointer come back by name and land in an AVR model's video/rgb/,
  stem included, unchanged."""
  from avtext.models import mbt  # pylint: disable=g-import-not-at-top
  tower = dict(hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32, rgb_patch_size=(2, 8, 8),
               audio_patch_size=(4, 4), n_bottlenecks=2, fusion_layer=0,
               demo=mbt.DemoOptions(rgb_stem=(4, 8)))
  inputs = {"rgb": np.zeros((1, 2, 16, 16, 3), np.float32),
            "audio": np.zeros((1, 8, 8), np.float32)}
  shapes = lambda m: jax.eval_shape(  # noqa: E731
      lambda: m.init(jax.random.PRNGKey(0), inputs, train=False))["params"]
  rng = np.random.default_rng(0)
  source = {"video": jax.tree.map(lambda s: rng.normal(size=s.shape).astype(np.float32),
                                  shapes(mbt.MBT(modalities="rgb", **tower)))}
  ckpt = checkpointing.Checkpointer(tmp_path / "checkpoints", async_save=False)
  ckpt.save(1, {"params": source}, None)
  ckpt.close()
  restored = checkpointing.restore_raw(tmp_path)[0]["params"]
  assert sorted(restored["video"]["rgb"]["stem"]) == ["conv_0", "conv_1", "norm_0", "norm_1"]
  target = {"video": jax.tree.map(lambda s: np.zeros(s.shape, s.dtype),
                                  shapes(mbt.MBT(modalities="rgb+audio", **tower)))}
  out = warm_start.transplant(target, restored, (("video/rgb/", "video/rgb/"),))
  assert jax.tree.structure(out["video"]["rgb"]) == jax.tree.structure(source["video"]["rgb"])
  jax.tree.map(np.testing.assert_array_equal, out["video"]["rgb"], source["video"]["rgb"])
  assert not any(np.any(x) for x in jax.tree.leaves(out["video"]["audio"]))  # not a target


def test_batch_stats_follow_the_params_prefixes(monkeypatch):
  """A BatchNorm network carried to a new run keeps its running statistics; a target
  with statistics where the source has none is an error; other prefixes are untouched."""
  stats = lambda v: {"mean": np.full(3, v, np.float32), "var": np.full(3, v + 1, np.float32)}  # noqa: E731
  source = {"params": {"encoder": {"kernel": np.ones((2, 3), np.float32),
                                   "bias": np.ones(3, np.float32)}},
            "model_state": {"batch_stats": {"encoder": {"bn": stats(5.0)}}}}
  monkeypatch.setattr(warm_start.checkpointing, "restore_raw", lambda workdir, step: (source, 7))
  config = ml_collections.ConfigDict(dict(init_from=dict(
      workdir="run", step=None, params=(("encoder", "video/rgb"),))))
  model_state = {"batch_stats": {"video": {"rgb": {"bn": stats(0.0)}},
                                 "text": {"bn": stats(0.0)}}}
  params, state = warm_start.apply_variables(_tree(), model_state, config)
  np.testing.assert_array_equal(params["video"]["rgb"]["kernel"], np.ones((2, 3)))
  got = state["batch_stats"]
  np.testing.assert_array_equal(got["video"]["rgb"]["bn"]["mean"], np.full(3, 5.0))
  np.testing.assert_array_equal(got["video"]["rgb"]["bn"]["var"], np.full(3, 6.0))
  np.testing.assert_array_equal(got["text"]["bn"]["mean"], np.zeros(3))  # not a target
  # No statistics under the target prefix: nothing asked of the source.
  params, state = warm_start.apply_variables(
      _tree(), {"batch_stats": {"text": {"bn": stats(0.0)}}}, config)
  np.testing.assert_array_equal(state["batch_stats"]["text"]["bn"]["mean"], np.zeros(3))
  # Statistics in the target but none in the source: an error, not fresh statistics.
  source["model_state"] = {}
  with pytest.raises(ValueError, match=r"has 'batch_stats' under \['video/rgb'\] but "
                                       r"checkpoint run \(step 7\) holds no 'batch_stats'"):
    warm_start.apply_variables(_tree(), model_state, config)
