"""GPT-2: parity with transformers' FlaxGPT2LMHeadModel, the HF importer, the tokenizer."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import save_file

from avtext.models import attention
from avtext.models import gpt2 as gpt2_lib
from avtext.text import tokenizers
from avtext.weights import gpt2 as gpt2_weights

transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=97, n_positions=40, n_embd=32, n_layer=2, n_head=4)


@pytest.fixture(scope="module")
def hf_tiny(tmp_path_factory):
  """A random tiny HF GPT-2 saved to disk (Flax naming), and the HF model."""
  config = transformers.GPT2Config(**TINY)
  model = transformers.FlaxGPT2LMHeadModel(config, seed=3)
  # Random LayerNorm parameters and biases, so a swapped tensor cannot hide.
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda x: np.asarray(x) + 0.1 * rng.standard_normal(x.shape).astype(
      np.float32), model.params)
  model.params = params
  path = tmp_path_factory.mktemp("gpt2") / "flax"
  model.save_pretrained(path, safe_serialization=True)
  return path, model


def _ours(path, **overrides):
  kwargs, params = gpt2_weights.load_hf_gpt2(path)
  kwargs.update(overrides)
  return gpt2_lib.GPT2(**kwargs), params


def test_logits_equal_hf_without_cache(hf_tiny):
  path, hf = hf_tiny
  model, params = _ours(path)
  ids = np.random.default_rng(1).integers(0, TINY["vocab_size"], (3, 11))
  want = np.asarray(hf(ids).logits)
  got = np.asarray(model.apply({"params": params}, jnp.asarray(ids)))
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


@pytest.mark.slow  # `make test-slow` (CI runs it): the default run's 12-minute budget
def test_logits_equal_hf_with_cache(hf_tiny):
  """Prefill 4 tokens then 1 token per call, against HF's own cached decoding."""
  path, hf = hf_tiny
  model, params = _ours(path)
  ids = np.random.default_rng(2).integers(0, TINY["vocab_size"], (2, 9))
  max_len = 12
  mask = attention.make_causal_mask(max_len)
  cache = model.apply({"params": params}, jnp.zeros((2, max_len), jnp.int32), mask=mask,
                      decode=True, mutable=["cache"])[1]["cache"]
  past = hf.init_cache(2, max_len)
  got, want = [], []
  chunks = [(0, 4)] + [(t, t + 1) for t in range(4, 9)]
  for lo, hi in chunks:
    logits, mutated = model.apply({"params": params, "cache": cache}, jnp.asarray(ids[:, lo:hi]),
                                  positions=jnp.arange(lo, hi), mask=mask, decode=True,
                                  mutable=["cache"])
    cache = mutated["cache"]
    got.append(np.asarray(logits))
    attention_mask = np.zeros((2, max_len), np.int32)
    attention_mask[:, :hi] = 1
    out = hf(ids[:, lo:hi], attention_mask=attention_mask, past_key_values=past,
             position_ids=np.broadcast_to(np.arange(lo, hi), (2, hi - lo)))
    past = out.past_key_values
    want.append(np.asarray(out.logits))
  np.testing.assert_allclose(np.concatenate(got, 1), np.concatenate(want, 1), atol=1e-5, rtol=0)
  # And both equal the uncached forward pass.
  full = np.asarray(model.apply({"params": params}, jnp.asarray(ids)))
  np.testing.assert_allclose(np.concatenate(got, 1), full, atol=1e-5, rtol=0)


def test_pytorch_layout_file_maps_to_the_same_params(hf_tiny, tmp_path):
  """The hub's PyTorch naming (Conv1D [in, out], .weight) gives the same parameters."""
  path, _ = hf_tiny
  _, want = gpt2_weights.load_hf_gpt2(path)
  from safetensors.numpy import load_file
  flax_tensors = load_file(str(path / "model.safetensors"))
  torch_tensors = {}
  for k, v in flax_tensors.items():
    k = k.removeprefix("transformer.")
    if k.endswith(".kernel"):
      torch_tensors[k.replace(".kernel", ".weight")] = np.ascontiguousarray(v.T)
    elif k.endswith(".scale"):
      torch_tensors[k.replace(".scale", ".weight")] = v
    elif k.endswith(".embedding"):
      torch_tensors[k.replace(".embedding", ".weight")] = v
    else:
      torch_tensors[k] = v
  torch_tensors["lm_head.weight"] = torch_tensors["wte.weight"]
  torch_tensors["h.0.attn.bias"] = np.tril(np.ones((1, 1, 40, 40), np.float32))
  save_file(torch_tensors, str(tmp_path / "model.safetensors"))
  (tmp_path / "config.json").write_text((path / "config.json").read_text())
  _, got = gpt2_weights.load_hf_gpt2(tmp_path)
  jax.tree.map(np.testing.assert_array_equal, got, want)
  # c_attn's query block is the first third of the output axis, split into heads.
  q = torch_tensors["h.1.attn.c_attn.weight"][:, :32].reshape(32, 4, 8)
  np.testing.assert_array_equal(got["h_1"]["attention"]["query"]["kernel"], q)


def test_importer_errors_name_the_problem(hf_tiny, tmp_path):
  path, _ = hf_tiny
  with pytest.raises(FileNotFoundError, match="config.json"):
    gpt2_weights.weights_dir(str(tmp_path))
  config = json.loads((path / "config.json").read_text())
  config["n_layer"] = 1
  (tmp_path / "config.json").write_text(json.dumps(config))
  (tmp_path / "model.safetensors").write_bytes((path / "model.safetensors").read_bytes())
  with pytest.raises(ValueError, match="does not use.*h.1"):
    gpt2_weights.load_hf_gpt2(tmp_path)


def test_vocab_subset_slices_the_tied_embedding(hf_tiny):
  path, hf = hf_tiny
  subset = np.array([5, 0, 96, 17])
  kwargs, params = gpt2_weights.load_hf_gpt2(path, vocab_subset=subset)
  assert kwargs["vocab_size"] == 4
  model = gpt2_lib.GPT2(**kwargs)
  ids_full = np.array([[96, 5, 17]])
  ids = np.array([[2, 0, 3]])  # the same tokens in compact ids
  got = np.asarray(model.apply({"params": params}, jnp.asarray(ids)))
  want = np.asarray(hf(ids_full).logits)[..., subset]
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_tokenizer_known_ids_and_round_trip(tmp_path):
  tok = tokenizers.CaptionTokenizer(max_len=8)
  # GPT-2's published encoding of "Hello world" and of " the".
  assert tok.bpe("Hello world") == [15496, 995]
  assert tok.bpe(" the") == [262]
  assert tok.eos_id == tok.bos_id == 50256 and tok.vocab_size == 50257
  out = tok("A red circle.")
  np.testing.assert_array_equal(out["input_ids"], [50256, 32, 2266, 9197, 13, 50256, 50256, 50256])
  np.testing.assert_array_equal(out["target_ids"], [32, 2266, 9197, 13, 50256, 50256, 50256, 50256])
  np.testing.assert_array_equal(out["target_mask"], [1, 1, 1, 1, 1, 0, 0, 0])
  assert tok.decode(out["target_ids"]) == "A red circle."
  cropped = tokenizers.CaptionTokenizer(max_len=3)("A red circle.")
  np.testing.assert_array_equal(cropped["target_mask"], [1, 1, 1])  # no EOS left
  # A vocab subset: compact ids, same text back; unknown tokens are an error.
  n = tokenizers.write_vocab_subset(["A red circle.", "a blue square"], tmp_path / "v.json")
  sub = tokenizers.CaptionTokenizer(max_len=8, vocab_subset=tmp_path / "v.json")
  assert sub.vocab_size == n == 8  # 7 distinct tokens + <|endoftext|>
  ids = sub("A red circle.")
  assert ids["input_ids"].max() < n and ids["input_ids"][0] == sub.eos_id == n - 1
  assert sub.decode(ids["target_ids"]) == "A red circle."
  np.testing.assert_array_equal(sub.gpt2_ids[ids["target_ids"][:4]], [32, 2266, 9197, 13])
  with pytest.raises(ValueError, match="green.*outside the vocab subset"):
    sub("A green circle.")


@pytest.mark.slow  # `make test-slow` (CI runs it): the default run's 12-minute budget
def test_captioner_prefix_lm_teacher_forcing_equals_cached_decoding():
  """[C ; BOS y_1 ..]: teacher-forced logits equal start/step with the KV cache."""
  from avtext.models import mbt
  video = mbt.MBT(modalities="rgb", hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
                  rgb_patch_size=(2, 8, 8))
  decoder = gpt2_lib.GPT2(vocab_size=23, max_positions=16, hidden_size=16, num_layers=2,
                          num_heads=2, mlp_dim=32)
  model = gpt2_lib.VideoCaptioner(video=video, decoder=decoder)
  rgb = jax.random.normal(jax.random.PRNGKey(0), (2, 2, 16, 16, 3))
  ids = jax.random.randint(jax.random.PRNGKey(1), (2, 6), 0, 23)
  variables = model.init(jax.random.PRNGKey(2), {"rgb": rgb}, ids)
  full = model.apply(variables, {"rgb": rgb}, ids)
  max_len = 6
  cache = model.apply(variables, {"rgb": rgb}, max_len, method=model.init_cache,
                      mutable=["cache"])[1]["cache"]
  logits, mut = model.apply({**variables, "cache": cache}, {"rgb": rgb}, ids[:, 0], max_len,
                            method=model.start, mutable=["cache"])
  got = [logits]
  p = 5  # 4 patch tokens + [CLS]
  for t in range(1, 6):
    logits, mut = model.apply({**variables, **mut}, ids[:, t], t, p, max_len,
                              method=model.step, mutable=["cache"])
    got.append(logits)
  np.testing.assert_allclose(np.stack(got, 1), full, atol=1e-5, rtol=0)
  # The prefix is bidirectional: the first prefix token sees the last one, so
  # changing the video changes the first word's logits; a later token never
  # changes an earlier position's logits.
  ids2 = ids.at[:, 4].set((ids[:, 4] + 1) % 23)
  full2 = model.apply(variables, {"rgb": rgb}, ids2)
  np.testing.assert_array_equal(full2[:, :4], full[:, :4])
  assert not np.allclose(full2[:, 4], full[:, 4])


@pytest.mark.slow  # `make test-slow` (CI runs it): the default run's 12-minute budget
def test_captioner_context_groups_average_patch_tokens():
  """context_groups=N: [CLS] + N group means of the patch tokens, then projected."""
  from avtext.models import mbt
  video = mbt.MBT(modalities="rgb", hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
                  rgb_patch_size=(2, 4, 4))
  decoder = gpt2_lib.GPT2(vocab_size=11, max_positions=8, hidden_size=8, num_layers=1,
                          num_heads=2, mlp_dim=16)
  rgb = jax.random.normal(jax.random.PRNGKey(0), (2, 2, 8, 8, 3))  # 4 patch tokens
  full = gpt2_lib.VideoCaptioner(video=video, decoder=decoder)
  grouped = gpt2_lib.VideoCaptioner(video=video, decoder=decoder, context_groups=2)
  variables = full.init(jax.random.PRNGKey(1), {"rgb": rgb}, jnp.zeros((2, 3), jnp.int32))
  tokens = video.apply({"params": variables["params"]["video"]}, {"rgb": rgb},
                       train=False)["tokens"]["rgb"]  # [2, 5, 16]
  want = jnp.stack([tokens[:, 0], tokens[:, 1:3].mean(1), tokens[:, 3:5].mean(1)], axis=1)
  proj = variables["params"]["video_projection"]
  want = want @ proj["kernel"] + proj["bias"]
  got = grouped.apply(variables, {"rgb": rgb}, method=grouped.encode)
  np.testing.assert_allclose(got, want, atol=1e-5)
  maxed = gpt2_lib.VideoCaptioner(video=video, decoder=decoder, context_groups=2,
                                  context_pool="max")
  want_max = np.stack([tokens[:, 0], np.maximum(tokens[:, 1], tokens[:, 2]),
                       np.maximum(tokens[:, 3], tokens[:, 4])], axis=1)
  np.testing.assert_allclose(maxed.apply(variables, {"rgb": rgb}, method=maxed.encode),
                             want_max @ proj["kernel"] + proj["bias"], atol=1e-5)
  with pytest.raises(ValueError, match="context_pool='median'"):
    gpt2_lib.VideoCaptioner(video=video, decoder=decoder, context_groups=2,
                            context_pool="median").apply(variables, {"rgb": rgb},
                                                         method="encode")
  assert full.apply(variables, {"rgb": rgb}, method=full.encode).shape == (2, 5, 8)
  with pytest.raises(ValueError, match="does not divide the 4 rgb patch tokens"):
    gpt2_lib.VideoCaptioner(video=video, decoder=decoder, context_groups=3).apply(
        variables, {"rgb": rgb}, method="encode")
