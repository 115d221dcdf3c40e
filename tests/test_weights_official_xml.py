"""Official TVR XML checkpoint import without torch: a state dict in the official names
and layouts (a tiny avtext XML's random parameters, written out by
`official_xml.to_official`, then perturbed so that a crossed mapping would show) saved as
.npz with the official model_cfg, imported with `import_checkpoint`, opened with
`runs.load_run`, and compared with a direct forward of the same weights."""
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avtext import runs
from avtext import import_checkpoint as import_tool
from avtext.weights import official
from avtext.weights import official_xml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "configs"))
import xml_tvr  # pylint: disable=g-import-not-at-top,wrong-import-position

DIMS = dict(video_dim=6, sub_dim=5, query_dim=4)
MODEL_CFG = dict(ctx_mode="video_sub", hidden_size=8, n_heads=2, max_ctx_l=6, max_desc_l=5,
                 drop=0.1, input_drop=0.1, conv_kernel_size=3, visual_input_size=6,
                 sub_input_size=5, query_input_size=4, cross_att=True, merge_two_stream=True,
                 span_predictor_type="conv", encoder_type="transformer",
                 stack_conv_predictor_conv_kernel_sizes=-1, conv_stride=1, no_modular=False,
                 margin=0.2, hard_pool_size=7)


def _config():
  config = xml_tvr.get_config("tiny")
  config.dataset.update(DIMS)
  return config


def _state_dict(rng):
  """Official tensors: a model of MODEL_CFG's shapes with every tensor randomized."""
  model = official_xml_model()
  batch = _batch(np.random.default_rng(0))
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), *batch)["params"]
  params = jax.tree.map(lambda s: rng.normal(size=s.shape).astype(np.float32) * 0.3, shapes)
  return official_xml.to_official(params)


def official_xml_model():
  from avtext.models import xml  # pylint: disable=g-import-not-at-top
  return xml.XML(hidden_size=8, num_heads=2, max_ctx_len=6, max_query_len=5,
                 conv_kernel_size=3, span_query_linear=True)


def _batch(rng):
  """Two items, the second padded (4 of 6 clips, 2 of 5 tokens)."""
  query = jnp.asarray(rng.normal(size=(2, 5, 4)), jnp.float32)
  query_mask = jnp.asarray([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]], jnp.int32)
  ctx = {"video": jnp.asarray(rng.normal(size=(2, 6, 6)), jnp.float32),
         "sub": jnp.asarray(rng.normal(size=(2, 6, 5)), jnp.float32)}
  ctx_mask = jnp.asarray([[1] * 6, [1] * 4 + [0] * 2], jnp.int32)
  ctx["video"] = ctx["video"] * ctx_mask[..., None]  # the official collate's zero padding
  ctx["sub"] = ctx["sub"] * ctx_mask[..., None]
  return query, query_mask, ctx, ctx_mask


def _unflatten(flat):
  tree = {}
  for k, v in flat.items():
    *parents, leaf = k.split("/")
    node = tree
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = v
  return tree


def test_npz_checkpoint_imports_and_evaluates_as_the_direct_forward(tmp_path):
  tensors = _state_dict(np.random.default_rng(1))
  ckpt = tmp_path / "model.npz"
  official.save_npz(ckpt, tensors, {"model_cfg": MODEL_CFG, "epoch": 3})
  run_dir = import_tool.import_checkpoint("xml", str(ckpt), str(tmp_path / "run"), _config())
  run = runs.load_run(run_dir)
  m = run.config.model
  assert (m.hidden_size, m.num_heads, m.max_ctx_len, m.max_query_len, m.conv_kernel_size,
          m.context, m.use_tef) == (8, 2, 6, 5, 3, "video_sub", False)
  assert not m.cross_output_linear and not m.masked_convse
  assert (run.config.loss.margin, run.config.loss.hard_pool_size) == (0.2, 7)
  # The direct forward: the same official tensors laid out by hand (transposes only).
  direct = {
      "query_proj": {"norm": {"scale": tensors["query_input_proj.LayerNorm.weight"],
                              "bias": tensors["query_input_proj.LayerNorm.bias"]},
                     "dense": {"kernel": tensors["query_input_proj.net.1.weight"].T,
                               "bias": tensors["query_input_proj.net.1.bias"]}},
      "convse": {"start": {"kernel": tensors["merged_st_predictor.weight"].reshape(3, 1, 1)},
                 "end": {"kernel": tensors["merged_ed_predictor.weight"].reshape(3, 1, 1)}},
      "modular": {"kernel": tensors["modular_vector_mapping.weight"].T},
      "video_cross": {"cross_attention": {"query": {
          "kernel": tensors["video_cross_att.query.weight"].T.reshape(8, 2, 4),
          "bias": tensors["video_cross_att.query.bias"].reshape(2, 4)}}},
      "sub_encoder1": {"attention": {"out": {
          "kernel": tensors["sub_encoder2.output.dense.weight"].T.reshape(2, 4, 8)}}},
  }
  got = jax.tree.map(np.asarray, run.params)
  for path, want in _flatten(direct).items():
    np.testing.assert_array_equal(_get(got, path), want, err_msg=path)
  # Same forward as the model built directly on the inverse-converted parameters.
  params = _unflatten({k: jnp.asarray(v) for k, v in _flatten(got).items()})
  assert official_xml.to_official(params).keys() == tensors.keys()
  for k, v in official_xml.to_official(params).items():
    np.testing.assert_array_equal(v, tensors[k], err_msg=k)
  batch = _batch(np.random.default_rng(2))
  out = jax.jit(run.model.apply)({"params": run.params}, *batch)
  ref = jax.jit(official_xml_model().apply)({"params": params}, *batch)
  for k in ("vr_scores", "query", "start", "end"):
    np.testing.assert_allclose(out[k], ref[k], rtol=1e-6, atol=1e-6, err_msg=k)
  assert np.all(np.asarray(out["start"][1, 4:]) == -1e10)


def test_missing_extra_and_misshaped_tensors_are_named(tmp_path):
  tensors = _state_dict(np.random.default_rng(3))
  del tensors["sub_cross_layernorm.bias"]
  tensors["video_encoder3.self.query.weight"] = np.zeros((8, 8), np.float32)
  tensors["merged_st_predictor.weight"] = np.zeros((1, 1, 5), np.float32)
  ckpt = tmp_path / "model.npz"
  official.save_npz(ckpt, tensors, {"model_cfg": MODEL_CFG})
  with pytest.raises(official.ImportCheckpointError) as e:
    import_tool.import_checkpoint("xml", str(ckpt), str(tmp_path / "run"), _config())
  msg = str(e.value)
  assert "'sub_cross_layernorm.bias' missing" in msg
  assert "video_encoder3.self.query.weight" in msg
  assert "merged_st_predictor.weight" in msg and "(3, 1, 1)" in msg
  assert "params/sub_cross/cross_attention_norm/bias" in msg  # the leaf left unset
  assert not (tmp_path / "run" / "config.json").exists()


def test_model_cfg_conflicts_stop_the_import_naming_the_field(tmp_path):
  ckpt = tmp_path / "model.npz"
  official.save_npz(ckpt, {"x": np.zeros(1, np.float32)},
                    {"model_cfg": {**MODEL_CFG, "ctx_mode": "video", "visual_input_size": 9}})
  with pytest.raises(ValueError) as e:
    official_xml.configure(_config(), official.read_checkpoint(ckpt))
  assert "ctx_mode='video'" in str(e.value)
  assert "visual_input_size=9 but config.dataset.video_dim=6" in str(e.value)
  config = xml_tvr.get_config("tiny,cross_linear")
  config.dataset.update(DIMS)
  with pytest.raises(ValueError, match="cross_output_linear=True"):
    official_xml.configure(config, official.read_checkpoint(ckpt))


def _flatten(tree, prefix=""):
  if isinstance(tree, dict):
    out = {}
    for k, v in tree.items():
      out.update(_flatten(v, f"{prefix}{k}/"))
    return out
  return {prefix[:-1]: tree}


def _get(tree, path):
  for k in path.split("/"):
    tree = tree[k]
  return tree
