"""Tests for avtext.models.bert and avtext.weights.bert.

Reference: transformers' FlaxBertModel (4.57.6) on the same weights. Our
loader reads PyTorch-named safetensors; FlaxBertModel either loads the same
file itself (MiniLM, `from_pt=True`, torch-free for safetensors) or exports its
own random params to that naming with the generic PyTorch<->Flax rules written
below (tiny configs), so the key mapping is checked by an independent path.
"""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file
from safetensors.numpy import save_file
import transformers

from avtext import assets
from avtext.models import layers
from avtext.models.bert import Bert
from avtext.weights import bert as bert_weights


def _tokens(batch, length, vocab, lengths, seed=0):
  """Random ids with [CLS]=101-style first token and zero padding."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(1, vocab, size=(batch, length))
  mask = (np.arange(length)[None] < np.asarray(lengths)[:, None]).astype(
      np.int32)
  types = (np.arange(length)[None] >= length // 2).astype(np.int32) * mask
  return ids * mask, mask, types


def _max_diff(a, b):
  return float(np.abs(np.asarray(a) - np.asarray(b)).max())


# ---------------------------------------------------------------------------
# Real MiniLM-L6 weights.


@pytest.fixture(scope="module")
def minilm():
  path = assets.minilm_l6_dir()
  ours, params = bert_weights.bert_from_hf(path, add_pooler=True)
  ref = transformers.FlaxBertModel.from_pretrained(str(path), from_pt=True)
  return ours, params, ref


def test_minilm_config_is_read(minilm):
  ours, _, _ = minilm
  assert (ours.vocab_size, ours.hidden_size, ours.num_layers, ours.num_heads,
          ours.mlp_dim) == (30522, 384, 6, 12, 1536)
  assert ours.activation == "gelu" and ours.layer_norm_eps == 1e-12


def test_minilm_matches_flax_bert_model(minilm):
  ours, params, ref = minilm
  ids, mask, types = _tokens(3, 16, ours.vocab_size, lengths=[16, 9, 4])
  ids[:, 0] = 101  # [CLS]
  with jax.default_matmul_precision("highest"):
    out = ours.apply({"params": params}, ids, mask, types)
    want = ref(ids, attention_mask=mask, token_type_ids=types)
  # All positions, padded ones included: masking is on keys only, as in HF.
  assert _max_diff(out["sequence"], want.last_hidden_state) <= 1e-5
  assert _max_diff(out["cls"], want.last_hidden_state[:, 0]) <= 1e-5
  assert _max_diff(out["pooled"], want.pooler_output) <= 1e-5


# ---------------------------------------------------------------------------
# Tiny random BERTs exported to PyTorch naming.


def _export_pytorch_named(model, directory, prefix, extra=None):
  """Writes config.json + model.safetensors the way a torch BertModel would.

  Generic rules, independent of our loader: LayerNorm scale -> weight, Embed
  embedding -> weight, Dense kernel [in, out] -> weight [out, in].
  """
  tensors = {}
  flat = jax.tree_util.tree_flatten_with_path(model.params)[0]
  for path, value in flat:
    keys = [p.key for p in path]
    value = np.asarray(value, np.float32)
    if keys[-1] in ("scale", "embedding"):
      keys[-1] = "weight"
    elif keys[-1] == "kernel":
      keys[-1], value = "weight", value.T
    tensors[prefix + ".".join(keys)] = np.ascontiguousarray(value)
  tensors.update(extra or {})
  save_file(tensors, str(directory / "model.safetensors"))
  model.config.to_json_file(str(directory / "config.json"))
  return tensors


def _tiny_reference(hidden_act="gelu", seed=0):
  config = transformers.BertConfig(
      vocab_size=50, hidden_size=24, num_hidden_layers=2,
      num_attention_heads=3, intermediate_size=40, max_position_embeddings=20,
      type_vocab_size=2, hidden_act=hidden_act)
  model = transformers.FlaxBertModel(config, seed=seed)
  # Random LayerNorm and bias values too, so a swapped mapping shows.
  rng = np.random.default_rng(seed)
  model.params = jax.tree_util.tree_map(
      lambda x: jnp.asarray(x + 0.1 * rng.normal(size=x.shape), jnp.float32),
      model.params)
  return model


@pytest.fixture(scope="module")
def tiny_refs():
  # Built once: constructing a FlaxBertModel runs its initializers eagerly.
  return {act: _tiny_reference(act) for act in ("gelu", "gelu_new")}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tiny_refs):
  """The gelu tiny BERT exported without prefix; tests must not modify it."""
  directory = tmp_path_factory.mktemp("tiny_bert")
  _export_pytorch_named(tiny_refs["gelu"], directory, "")
  return directory


@pytest.mark.parametrize("hidden_act,prefix", [("gelu", "bert."),
                                               ("gelu_new", "")])
def test_tiny_random_bert_matches_flax_bert_model(tmp_path, tiny_refs,
                                                  hidden_act, prefix):
  ref = tiny_refs[hidden_act]
  extras = {"embeddings.position_ids": np.arange(20, dtype=np.int64)[None],
            "cls.predictions.bias": np.zeros(50, np.float32)}
  _export_pytorch_named(ref, tmp_path, prefix, extras)
  kwargs, params = bert_weights.load_hf_bert(tmp_path, add_pooler=True)
  assert kwargs["activation"] == {"gelu": "gelu", "gelu_new": "gelu_tanh"}[
      hidden_act]
  ours = Bert(**kwargs)
  ids, mask, types = _tokens(4, 12, 50, lengths=[12, 7, 3, 1], seed=1)
  with jax.default_matmul_precision("highest"):
    out = ours.apply({"params": params}, ids, mask, types)
    want = ref(ids, attention_mask=mask, token_type_ids=types)
  assert _max_diff(out["sequence"], want.last_hidden_state) <= 1e-5
  assert _max_diff(out["pooled"], want.pooler_output) <= 1e-5
  # Default token types are zeros, as in HF.
  with jax.default_matmul_precision("highest"):
    out0 = ours.apply({"params": params}, ids, mask)
    want0 = ref(ids, attention_mask=mask)
  assert _max_diff(out0["sequence"], want0.last_hidden_state) <= 1e-5


def test_padding_does_not_change_real_tokens(tiny_dir):
  ours, params = bert_weights.bert_from_hf(tiny_dir)
  ids, mask, _ = _tokens(2, 10, 50, lengths=[6, 4])
  other = np.where(mask > 0, ids, 7)  # Different ids under the padding.
  a = ours.apply({"params": params}, ids, mask)["sequence"]
  b = ours.apply({"params": params}, other, mask)["sequence"]
  short = ours.apply({"params": params}, ids[:, :6], mask[:, :6])["sequence"]
  real = mask[:, :, None] > 0
  np.testing.assert_allclose(np.where(real, a, 0), np.where(real, b, 0),
                             atol=1e-6)
  np.testing.assert_allclose(np.where(real[:, :6], a[:, :6], 0),
                             np.where(real[:, :6], short, 0), atol=1e-5)


def test_dropout_only_in_train_mode(tiny_dir):
  ours, params = bert_weights.bert_from_hf(tiny_dir)
  assert ours.dropout_rate == 0.1  # From config.json (hidden_dropout_prob).
  ids, mask, _ = _tokens(2, 8, 50, lengths=[8, 5])
  run = lambda **kw: ours.apply({"params": params}, ids, mask, **kw)["cls"]
  np.testing.assert_array_equal(run(), run(train=False))
  a = run(train=True, rngs={"dropout": jax.random.PRNGKey(0)})
  b = run(train=True, rngs={"dropout": jax.random.PRNGKey(1)})
  assert _max_diff(a, run()) > 1e-3 and _max_diff(a, b) > 1e-3
  no_dropout, _ = bert_weights.bert_from_hf(tiny_dir, dropout_rate=0.0,
                                            attention_dropout_rate=0.0)
  np.testing.assert_allclose(
      no_dropout.apply({"params": params}, ids, mask, train=True)["cls"],
      run(), atol=1e-6)


# ---------------------------------------------------------------------------
# Loader errors.


def _broken_dir(tmp_path, source, edit_tensors=None, edit_config=None):
  """A copy of the tiny BERT directory `source` with one thing changed."""
  tensors = load_file(str(source / "model.safetensors"))
  config = json.loads((source / "config.json").read_text())
  if edit_tensors:
    edit_tensors(tensors)
  if edit_config:
    edit_config(config)
  save_file(tensors, str(tmp_path / "model.safetensors"))
  (tmp_path / "config.json").write_text(json.dumps(config))
  return tmp_path


def _drop_value_weight(tensors):
  del tensors["encoder.layer.1.attention.self.value.weight"]


def _set_config(key, value):
  return lambda config: config.__setitem__(key, value)


@pytest.mark.parametrize("edit_tensors,edit_config,error,match", [
    (_drop_value_weight, None, KeyError,
     r"encoder\.layer\.1\.attention\.self\.value\.weight"),
    (None, _set_config("vocab_size", 51), ValueError,
     r"word_embeddings\.weight.*\(50, 24\)"),
    # Layers the config does not declare are reported, not dropped.
    (None, _set_config("num_hidden_layers", 1), ValueError,
     r"encoder\.layer\.1\."),
])
def test_loader_errors_name_the_tensor(tmp_path, tiny_dir, edit_tensors,
                                       edit_config, error, match):
  path = _broken_dir(tmp_path, tiny_dir, edit_tensors, edit_config)
  with pytest.raises(error, match=match):
    bert_weights.load_hf_bert(path)


def test_missing_files_and_unsupported_config(tmp_path):
  with pytest.raises(FileNotFoundError, match="config.json"):
    bert_weights.load_hf_bert(tmp_path)
  with pytest.raises(ValueError, match="position_embedding_type"):
    bert_weights.bert_kwargs_from_hf_config(
        {"vocab_size": 1, "hidden_size": 1, "num_hidden_layers": 1,
         "num_attention_heads": 1, "intermediate_size": 1,
         "max_position_embeddings": 1,
         "position_embedding_type": "relative_key"})


# ---------------------------------------------------------------------------
# layers.EncoderBlock options that neither BERT nor MBT use.


def test_encoder_block_causal_and_padding_masks():
  block = layers.EncoderBlock(num_heads=2, mlp_dim=16, causal=True)
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(2, 5, 8)), jnp.float32)
  shapes = jax.eval_shape(
      lambda: block.init(jax.random.PRNGKey(0), x, deterministic=True))
  params = jax.tree_util.tree_map(
      lambda s: jnp.asarray(rng.normal(size=s.shape), jnp.float32), shapes)
  run = lambda x, pad=None: block.apply(params, x, pad, deterministic=True)
  future = x.at[:, 3:].add(1.0)
  np.testing.assert_array_equal(run(future)[:, :3], run(x)[:, :3])
  assert _max_diff(run(future)[:, 3:], run(x)[:, 3:]) > 1e-3
  # Padded keys are invisible to every query; causal still applies on top.
  pad = jnp.array([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]])
  changed = x.at[0, 4].add(1.0).at[1, 2:].add(1.0)
  a, b = run(x, pad), run(changed, pad)
  np.testing.assert_array_equal(a[0, :4], b[0, :4])
  np.testing.assert_array_equal(a[1, :2], b[1, :2])
