"""Official COOT checkpoint import without torch: an .npz state dict in the official names and
layouts (nntrainer's {network: state_dict}, flattened) -> run directory -> the same function."""
import jax
import numpy as np
import pytest

from avtext import runs
from avtext.models import coot
from avtext import import_checkpoint as import_tool
from avtext.weights import official

CONFIG = "configs/coot_activitynet.py:tiny"
NETS = {"video_local": "net_video_local", "video_global": "net_video_global",
        "text_local": "net_text_local", "text_global": "net_text_global"}


def _official_layer(p, prefix, attention):
  """An avtext EncoderBlock's params -> official TransformerEncoderLayer tensors."""
  a = p[attention]
  out = {}
  sub = f"{prefix}.self_attention_layer.sublayer"
  for proj in ("query", "key", "value"):
    kernel = np.asarray(a[proj]["kernel"])  # [in, H, Dh]
    out[f"{sub}.{proj}_projection.weight"] = kernel.reshape(kernel.shape[0], -1).T
    out[f"{sub}.{proj}_projection.bias"] = np.asarray(a[proj]["bias"]).reshape(-1)
  kernel = np.asarray(a["out"]["kernel"])  # [H, Dh, out]
  out[f"{sub}.final_projection.weight"] = kernel.reshape(-1, kernel.shape[-1]).T
  out[f"{sub}.final_projection.bias"] = np.asarray(a["out"]["bias"])
  for name, norm in ((f"{prefix}.self_attention_layer", f"{attention}_norm"),
                     (f"{prefix}.pointwise_feedforward_layer", "mlp_norm")):
    out[f"{name}.layer_normalization.gain"] = np.asarray(p[norm]["scale"])
    out[f"{name}.layer_normalization.bias"] = np.asarray(p[norm]["bias"])
  ff = f"{prefix}.pointwise_feedforward_layer.sublayer.feed_forward"
  for i, dense in ((0, "dense_in"), (3, "dense_out")):
    out[f"{ff}.{i}.weight"] = np.asarray(p["mlp"][dense]["kernel"]).T
    out[f"{ff}.{i}.bias"] = np.asarray(p["mlp"][dense]["bias"])
  return out


def official_state(params, hidden):
  """avtext COOT params -> the official flat state dict ("<network>.<tensor>")."""
  tensors = {}
  for module, net in NETS.items():
    p = params[module]
    tensors[f"{net}.norm_input.gain"] = np.asarray(p["norm_input"]["scale"])
    tensors[f"{net}.norm_input.bias"] = np.asarray(p["norm_input"]["bias"])
    tensors[f"{net}.embedding.pe"] = coot.sincos_table(1000, hidden)
    if "input_fc" in p:
      tensors[f"{net}.input_fc.mlp.0.weight"] = np.asarray(p["input_fc"]["kernel"]).T
      tensors[f"{net}.input_fc.mlp.0.bias"] = np.asarray(p["input_fc"]["bias"])
    tensors.update({f"{net}.{k}": v for k, v in _official_layer(
        p["encoderblock_0"], "tf.encoder_layers.0", "attention").items()})
    if "context" in p:
      tensors.update({f"{net}.{k}": v for k, v in _official_layer(
          p["context"], "tf_context.encoder_layers.0", "cross_attention").items()})
    if "pooler" in p:
      for w in ("w1", "b1", "w2", "b2"):
        tensors[f"{net}.pooler.pools.0.genpool_{w}_head"] = np.asarray(p["pooler"][w])
      tensors[f"{net}.pooler.pools.0.genpool_one"] = np.ones(1, np.float32)
  return tensors


def padded_batch(rng, video_dim, text_dim, max_clips):
  """Two videos with 2 and 3 clips (different frame / token counts): padding everywhere."""
  clips_per_video, frames, tokens = (2, 3), (5, 7), (6, 9)
  v = np.zeros((2, 8, video_dim), np.float32)
  p = np.zeros((2, 10, text_dim), np.float32)
  for b in range(2):
    v[b, :frames[b]] = rng.normal(size=(frames[b], video_dim))
    p[b, :tokens[b]] = rng.normal(size=(tokens[b], text_dim))
  vm, pm = np.arange(8)[None] < np.array(frames)[:, None], np.arange(10)[None] < np.array(
      tokens)[:, None]
  lengths = np.array([3, 4, 2, 5, 1, 0, 0, 0])  # 5 real clips, 3 padding rows
  c = rng.normal(size=(8, 5, video_dim)).astype(np.float32)
  s = rng.normal(size=(8, 4, text_dim)).astype(np.float32)
  cm, sm = np.arange(5)[None] < lengths[:, None], np.arange(4)[None] < np.minimum(lengths, 4)[:, None]
  c, s = c * cm[..., None], s * sm[..., None]
  slot = np.array([0, 1, max_clips, max_clips + 1, max_clips + 2, -1, -1, -1], np.int32)
  assert clips_per_video == (2, 3)
  return v, vm, c, cm, slot, p, pm, s, sm, slot


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
  config = runs.config_file(CONFIG)
  m = config.model
  model = coot.coot_from_config(m)
  rng = np.random.default_rng(0)
  batch = padded_batch(rng, m.video_dim, m.text_dim, m.max_clips)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), *batch)["params"]
  # Every leaf random (layer-norm gains and biases too), so a wrong mapping shows.
  params = jax.tree.map(lambda x: rng.normal(0, 0.3, x.shape).astype(np.float32), shapes)
  tmp = tmp_path_factory.mktemp("official_coot")
  tensors = official_state(params, m.hidden_size)
  official.save_npz(tmp / "model_0.npz", tensors)
  run_dir = import_tool.import_checkpoint("coot", str(tmp / "model_0.npz"), str(tmp / "run"),
                                   config=config)
  return model, params, tensors, batch, run_dir, tmp


def test_import_round_trip_equals_direct_forward(imported):
  model, params, _, batch, run_dir, _ = imported
  run = runs.load_run(run_dir)
  assert not run.config.model.masked_pool  # the official global mean
  jax.tree.map(np.testing.assert_array_equal, run.params, params)
  assert run.model == model  # the same module from the run's config.json
  forward = jax.jit(lambda p: model.apply({"params": p}, *batch))  # one compile for both
  got_v, got_t = forward(run.params)
  want_v, want_t = forward(params)
  for got, want in ((got_v, want_v), (got_t, want_t)):
    for key in got:
      np.testing.assert_allclose(got[key], want[key], rtol=1e-6, atol=1e-6, err_msg=key)
  assert (run_dir / official.IMPORT_FILE).exists()


def test_missing_extra_and_misfit_tensors_are_named(imported):
  _, _, tensors, _, _, tmp = imported
  bad = dict(tensors)
  del bad["net_text_global.tf_context.encoder_layers.0.self_attention_layer.sublayer."
          "key_projection.bias"]
  bad["net_video_local.surplus"] = np.zeros(3, np.float32)
  official.save_npz(tmp / "bad.npz", bad)
  with pytest.raises(official.ImportCheckpointError) as err:
    import_tool.import_checkpoint("coot", str(tmp / "bad.npz"), str(tmp / "bad_run"),
                           config=runs.config_file(CONFIG))
  assert "tf_context.encoder_layers.0.self_attention_layer.sublayer.key_projection.bias" in str(
      err.value) and "net_video_local.surplus" in str(err.value)
  # an input width the config's features do not have stops naming the field
  wide = dict(tensors)
  wide["net_video_local.norm_input.gain"] = np.ones(7, np.float32)
  official.save_npz(tmp / "wide.npz", wide)
  with pytest.raises(ValueError, match="config.dataset.video_dim=16"):
    import_tool.import_checkpoint("coot", str(tmp / "wide.npz"), str(tmp / "wide_run"),
                           config=runs.config_file(CONFIG))


def test_a_checkpoint_of_one_state_dict_per_network_is_flattened(tmp_path):
  """nntrainer's models file is {network: state_dict} (trainer_base._save_checkpoint)."""
  w = np.ones((2, 3), np.float32)
  tensors, meta = official.split_state_dict(
      {"net_video_local": {"a.weight": w}, "net_text_local": {"b.bias": w[0]}}, tmp_path)
  assert sorted(tensors) == ["net_text_local.b.bias", "net_video_local.a.weight"] and not meta
  tensors, _ = official.split_state_dict([{"a.weight": w}, {"a.weight": w}], tmp_path)
  assert sorted(tensors) == ["0.a.weight", "1.a.weight"]
  # a "model" entry still wins (other systems' checkpoints)
  assert list(official.split_state_dict({"model": {"a": w}, "x": {"b": w}}, tmp_path)[0]) == ["a"]
