"""S-MiT pieces: the GLU projection head and word sampling (avtext/models/smit.py, heads.py)."""
import flax.linen
import jax
import jax.numpy as jnp
import numpy as np

from avtext.models import heads
from avtext.models import smit
from avtext.text import tokenizers


def test_gated_embedding_hand_computed():
  x = np.array([[1.0, -2.0]], np.float32)
  w1 = np.array([[0.5, -1.0, 0.0], [0.25, 0.5, 1.0]], np.float32)
  b1 = np.array([0.1, 0.0, -0.2], np.float32)
  w2 = np.array([[1.0, 0.0, 0.0], [0.0, -1.0, 0.0], [0.0, 0.0, 2.0]], np.float32)
  b2 = np.array([0.0, 0.5, 0.0], np.float32)
  params = {"linear1": {"kernel": w1, "bias": b1}, "linear2": {"kernel": w2, "bias": b2}}
  # h = x W1 + b1 = [0.5 - 0.5 + 0.1, -1 - 1, -2 - 0.2] = [0.1, -2.0, -2.2]
  # gate = sigmoid(h W2 + b2) = sigmoid([0.1, 2.0 + 0.5, -4.4])
  h = np.array([0.1, -2.0, -2.2])
  y = h / (1 + np.exp(-np.array([0.1, 2.5, -4.4])))
  out = heads.GatedEmbedding(features=3, normalize=False).apply({"params": params}, x)
  np.testing.assert_allclose(out[0], y, rtol=1e-6)
  out = heads.GatedEmbedding(features=3).apply({"params": params}, x)
  np.testing.assert_allclose(out[0], y / np.linalg.norm(y), rtol=1e-6)


def test_word_features_average_each_words_pieces():
  tokens = jnp.arange(10, dtype=jnp.float32).reshape(1, 5, 2)  # t_i = [2i, 2i+1]
  words, mask = smit.word_features(tokens, jnp.array([[-1, 0, 1, 1, -1]]), num_words=3)
  np.testing.assert_allclose(words[0, 0], [2, 3])  # token 1
  np.testing.assert_allclose(words[0, 1], [5, 6])  # mean of tokens 2 and 3
  np.testing.assert_allclose(words[0, 2], [0, 0])
  np.testing.assert_array_equal(mask, [[True, True, False]])
  # Through the tokenizer: "unbelievably" is 5 WordPieces, one word.
  tok = tokenizers.Tokenizer(max_len=12)(["a disc unbelievably slow"], with_words=True)
  np.testing.assert_array_equal(tok["word_index"][0, :10], [-1, 0, 1, 2, 2, 2, 2, 2, 3, -1])


def test_pool_words_hand_computed():
  words = jnp.array([[[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]]])
  mask = jnp.array([[True, True, False]])
  np.testing.assert_allclose(smit.pool_words(words, mask)[0], [0.5, 0.5])
  # positions [0, 0, 1]: (2 w0 + w1) / 3
  np.testing.assert_allclose(smit.pool_words(words, mask, jnp.array([[0, 0, 1]]))[0],
                             [2 / 3, 1 / 3], rtol=1e-6)
  np.testing.assert_allclose(smit.pool_words(words, jnp.zeros((1, 3), bool))[0], [0, 0])


def test_sample_words_without_replacement_from_ten_words_with_it_below():
  mask = np.zeros((4, 16), bool)
  mask[0, :12] = True  # 12 words: 10 distinct
  mask[1, :10] = True  # 10 words: each once
  mask[2, :3] = True  # 3 words: with replacement
  sample = jax.jit(smit.sample_words)
  counts = np.zeros(3)
  seen_first = set()
  for i in range(300):
    pos = np.asarray(sample(jax.random.PRNGKey(i), jnp.asarray(mask)))
    assert pos.shape == (4, 10)
    assert len(set(pos[0])) == 10 and pos[0].max() < 12
    assert sorted(pos[1]) == list(range(10))
    assert pos[2].max() < 3
    counts += np.bincount(pos[2], minlength=3)
    seen_first |= set(pos[0])
  np.testing.assert_allclose(counts / counts.sum(), [1 / 3] * 3, atol=0.02)  # 3000 draws
  assert seen_first == set(range(12))  # every word of the long caption gets drawn


class _TinyBackbone(flax.linen.Module):
  """A conv + BatchNorm backbone returning {'embedding'}: the frozen-phase logic under test
  is the VideoModel's, not the backbone's (ResNet has its own tests)."""

  @flax.linen.compact
  def __call__(self, x, *, train=False):
    x = flax.linen.Conv(4, (3, 3))(x)
    x = flax.linen.BatchNorm(use_running_average=not train, momentum=0.9)(x)
    return {"embedding": jnp.mean(flax.linen.relu(x), axis=(1, 2))}


def test_video_model_frozen_backbone_keeps_batch_stats_and_gets_no_gradient():
  frames = jax.random.uniform(jax.random.PRNGKey(0), (2, 3, 16, 16, 3))
  for train_backbones in (False, True):
    model = smit.VideoModel(image=_TinyBackbone(), temporal=None,
                            head=heads.GatedEmbedding(features=8),
                            train_backbones=train_backbones)
    variables = model.init(jax.random.PRNGKey(1), {"image_frames": frames})

    def loss(params):
      out, state = model.apply({"params": params, "batch_stats": variables["batch_stats"]},
                               {"image_frames": frames}, train=True, mutable=["batch_stats"])
      return jnp.sum(out[0] * out[1]), state

    grads, state = jax.jit(jax.grad(loss, has_aux=True))(variables["params"])
    same = jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), state["batch_stats"],
                        variables["batch_stats"])
    image_grad = sum(float(jnp.abs(g).sum()) for g in jax.tree.leaves(grads["image"]))
    head_grad = sum(float(jnp.abs(g).sum()) for g in jax.tree.leaves(grads["head"]))
    assert head_grad > 0
    if train_backbones:
      assert not all(jax.tree.leaves(same)) and image_grad > 0
    else:
      assert all(jax.tree.leaves(same)) and image_grad == 0.0
  # Frames mode max-pools the per-frame embeddings: equal frames give one frame's answer.
  model = smit.VideoModel(image=_TinyBackbone(), temporal=None,
                          head=heads.GatedEmbedding(features=8))
  v = model.init(jax.random.PRNGKey(1), {"image_frames": frames})
  one = jnp.repeat(frames[:, :1], 3, axis=1)
  apply = jax.jit(model.apply)
  np.testing.assert_allclose(apply(v, {"image_frames": one}),
                             apply(v, {"image_frames": frames[:, :1]}), rtol=1e-6)


def test_language_caption_model_pools_words_of_the_frozen_encoder():
  from avtext.models import bert  # pylint: disable=g-import-not-at-top
  text = bert.Bert(vocab_size=64, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
                   max_position_embeddings=16)
  model = smit.LanguageCaptionModel(text=text, head=heads.GatedEmbedding(features=8),
                                    max_words=6)
  ids = jnp.array([[1, 5, 6, 7, 8, 2, 0, 0], [1, 9, 10, 2, 0, 0, 0, 0]])
  mask = (ids > 0).astype(jnp.int32)
  words = jnp.array([[-1, 0, 1, 1, 2, -1, -1, -1], [-1, 0, 1, -1, -1, -1, -1, -1]])
  v = model.init(jax.random.PRNGKey(0), ids, mask, words)
  seq = text.apply({"params": v["params"]["text"]}, ids, mask)["sequence"]
  head = lambda x: heads.GatedEmbedding(features=8).apply({"params": v["params"]["head"]}, x)
  # Test: every word; word 1 of caption 0 is the mean of its two pieces.
  w0 = jnp.stack([seq[0, 1], (seq[0, 2] + seq[0, 3]) / 2, seq[0, 4]]).mean(0)
  w1 = jnp.stack([seq[1, 1], seq[1, 2]]).mean(0)
  np.testing.assert_allclose(model.apply(v, ids, mask, words), head(jnp.stack([w0, w1])),
                             rtol=1e-5, atol=1e-6)
  # Training: the 10 sampled words (with replacement here: 3 and 2 words).
  key = jax.random.PRNGKey(3)
  wf, wm = smit.word_features(seq, words, 6)
  expected = head(smit.pool_words(wf, wm, smit.sample_words(key, wm)))
  np.testing.assert_allclose(model.apply(v, ids, mask, words, train=True, sample_rng=key),
                             expected, rtol=1e-5, atol=1e-6)
