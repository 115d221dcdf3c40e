"""Tests for avtext.losses.xml (TVR eq. 4-6)."""
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from avtext.losses import xml as xml_losses

SETTINGS = hypothesis.settings(max_examples=25, deadline=None)


def _lengths_to_mask(lengths, size):
  return np.arange(size)[None, :] < np.asarray(lengths)[:, None]


def _ref_scores(query, clips, mask):
  """TVR eq. 4 with loops: mean over modalities of the max cosine over real clips."""
  nq, nm, _ = query.shape
  nv = clips.shape[0]
  out = np.zeros((nq, nv))
  for q in range(nq):
    for v in range(nv):
      per_modality = []
      for m in range(nm):
        a = query[q, m] / np.linalg.norm(query[q, m])
        cos = [a @ c / np.linalg.norm(c) for c, real in zip(clips[v, m], mask[v]) if real]
        per_modality.append(max(cos))
      out[q, v] = np.mean(per_modality)
  return out


def _ref_hinge(scores, neg_video, neg_query, margin):
  """TVR eq. 5 with loops."""
  n = len(scores)
  total = 0.0
  for i in range(n):
    total += max(0.0, margin + scores[i, neg_video[i]] - scores[i, i])
    total += max(0.0, margin + scores[neg_query[i], i] - scores[i, i])
  return total / n


def _ref_svmr_nll(start_logits, end_logits, start_idx, end_idx, lengths):
  """TVR eq. 6 with loops: log-softmax over the real clips only."""
  total = 0.0
  for i, length in enumerate(lengths):
    for logits, idx in ((start_logits[i], start_idx[i]), (end_logits[i], end_idx[i])):
      real = logits[:length].astype(np.float64)
      total -= real[idx] - np.log(np.sum(np.exp(real)))
  return total / len(lengths)


def test_video_retrieval_scores_hand_worked():
  # Query (1, 0) for both modalities. Video modality: clips (0, 1), (1, 1) and
  # a padded (1, 0); best real cosine 1/sqrt 2 (the padding would give 1).
  # Subtitle modality: clips (-1, 0), (2, 0): best cosine 1. Mean: (c + 1) / 2.
  query = np.array([[[1.0, 0.0], [3.0, 0.0]]], np.float32)
  clips = np.array([[[[0.0, 1.0], [1.0, 1.0], [1.0, 0.0]],
                     [[-1.0, 0.0], [2.0, 0.0], [5.0, 0.0]]]], np.float32)
  mask = np.array([[True, True, False]])
  np.testing.assert_allclose(xml_losses.video_retrieval_scores(query, clips, mask),
                             [[(1 / np.sqrt(2) + 1) / 2]], rtol=1e-6)


def test_video_retrieval_hinge_hand_worked():
  scores = np.array([[0.9, 0.85, 0.1],
                     [0.2, 0.5, 0.7],
                     [0.0, 0.3, 0.4]], np.float32)
  neg_video = np.array([1, 2, 0])
  neg_query = np.array([2, 0, 1])
  # q0: 0.1 + 0.85 - 0.9 = 0.05 and 0.1 + 0.0 - 0.9 < 0
  # q1: 0.1 + 0.7 - 0.5 = 0.3 and 0.1 + 0.85 - 0.5 = 0.45
  # q2: 0.1 + 0.0 - 0.4 < 0 and 0.1 + 0.7 - 0.4 = 0.4
  expected = (0.05 + 0.3 + 0.45 + 0.4) / 3
  np.testing.assert_allclose(
      xml_losses.video_retrieval_hinge(scores, neg_video, neg_query, margin=0.1),
      expected, rtol=1e-6)


def test_svmr_nll_hand_worked():
  # Equal logits over 4 real clips of 6: P = 1/4 at every real clip, so the
  # loss is 2 log 4 whatever the padded logits are.
  logits = np.array([[0.0, 0.0, 0.0, 0.0, 50.0, -50.0]], np.float32)
  mask = np.array([[True] * 4 + [False] * 2])
  np.testing.assert_allclose(
      xml_losses.svmr_nll(logits, logits, np.array([1]), np.array([3]), mask),
      2 * np.log(4), rtol=1e-6)
  # Start logits log([1, 2, 1]) -> P_st(1) = 1/2; end uniform over 3 -> 1/3.
  start = np.log(np.array([[1.0, 2.0, 1.0]], np.float32))
  end = np.zeros((1, 3), np.float32)
  np.testing.assert_allclose(
      xml_losses.svmr_nll(start, end, np.array([1]), np.array([2]), np.ones((1, 3), bool)),
      np.log(2) + np.log(3), rtol=1e-6)


_scores_jit = jax.jit(xml_losses.video_retrieval_scores)
_hinge_jit = jax.jit(lambda s, nv, nq, margin: xml_losses.video_retrieval_hinge(
    s, nv, nq, margin=margin))
_svmr_jit = jax.jit(xml_losses.svmr_nll)


@SETTINGS
@hypothesis.given(seed=st.integers(0, 2**31 - 1), margin=st.floats(0.0, 1.0))
def test_video_retrieval_matches_loop_reference(seed, margin):
  rng = np.random.default_rng(seed)
  n, modalities, clips, dim = 5, 2, 4, 3
  query = rng.normal(size=(n, modalities, dim)).astype(np.float32)
  video = rng.normal(size=(n, modalities, clips, dim)).astype(np.float32)
  mask = _lengths_to_mask(rng.integers(1, clips + 1, size=n), clips)
  scores = _scores_jit(query, video, mask)
  np.testing.assert_allclose(scores, _ref_scores(query, video, mask), rtol=1e-5, atol=1e-6)
  neg_video, neg_query = xml_losses.sample_negatives(jax.random.key(seed), scores)
  np.testing.assert_allclose(
      _hinge_jit(scores, neg_video, neg_query, margin),
      _ref_hinge(np.asarray(scores), np.asarray(neg_video), np.asarray(neg_query), margin),
      rtol=1e-5, atol=1e-6)


@SETTINGS
@hypothesis.given(seed=st.integers(0, 2**31 - 1))
def test_video_retrieval_invariant_to_batch_permutation(seed):
  rng = np.random.default_rng(seed)
  n = 6
  query = rng.normal(size=(n, 2, 3)).astype(np.float32)
  video = rng.normal(size=(n, 2, 4, 3)).astype(np.float32)
  mask = _lengths_to_mask(rng.integers(1, 5, size=n), 4)
  neg_video = (np.arange(n) + rng.integers(1, n, size=n)) % n
  neg_query = (np.arange(n) + rng.integers(1, n, size=n)) % n
  loss = _hinge_jit(_scores_jit(query, video, mask), neg_video, neg_query, 0.1)
  # Item perm[k] moves to position k; its negatives follow, renamed by inv.
  perm = rng.permutation(n)
  inv = np.argsort(perm)
  permuted = _hinge_jit(_scores_jit(query[perm], video[perm], mask[perm]),
                        inv[neg_video[perm]], inv[neg_query[perm]], 0.1)
  np.testing.assert_allclose(permuted, loss, rtol=1e-5)


def test_sample_negatives_uniform_over_other_items():
  n = 5
  scores = jnp.asarray(np.random.default_rng(0).normal(size=(n, n)), jnp.float32)
  draws = jax.jit(jax.vmap(lambda key: xml_losses.sample_negatives(key, scores)))(
      jax.random.split(jax.random.key(0), 4000))
  for idx in draws:  # neg_video, neg_query
    idx = np.asarray(idx)
    assert np.all(idx != np.arange(n)[None])
    for i in range(n):
      counts = np.bincount(idx[:, i], minlength=n)
      assert counts[i] == 0
      # 1000 expected per other item; 5 sigma is about 140.
      np.testing.assert_allclose(np.delete(counts, i), 1000, atol=150)


def test_sample_negatives_hard_pool_draws_from_hardest_other_items():
  n, pool = 6, 2
  scores = np.random.default_rng(1).normal(size=(n, n)).astype(np.float32)
  scores[np.arange(n), np.arange(n)] = -5.0  # the positive must be skipped anyway
  draws = jax.jit(jax.vmap(lambda key: xml_losses.sample_negatives(
      key, scores, hard_pool_size=pool)))(jax.random.split(jax.random.key(0), 500))
  for idx, anchored in zip(draws, (scores, scores.T)):
    idx = np.asarray(idx)
    for i in range(n):
      others = [j for j in np.argsort(-anchored[i], kind="stable") if j != i]
      assert set(np.unique(idx[:, i])) == set(others[:pool])


def test_sample_negatives_and_hinge_reject_bad_inputs():
  with pytest.raises(ValueError, match="N >= 2"):
    xml_losses.sample_negatives(jax.random.key(0), jnp.ones((1, 1)))
  with pytest.raises(ValueError, match="hard_pool_size"):
    xml_losses.sample_negatives(jax.random.key(0), jnp.ones((3, 3)), hard_pool_size=0)
  with pytest.raises(ValueError, match="one negative video"):
    xml_losses.video_retrieval_hinge(jnp.ones((3, 3)), jnp.zeros(2, int), jnp.zeros(3, int))
  with pytest.raises(ValueError, match=r"clip_mask \[Nv, L\]"):
    xml_losses.video_retrieval_scores(jnp.ones((2, 2, 3)), jnp.ones((2, 2, 4, 3)),
                                   jnp.ones((2, 3), bool))
  with pytest.raises(ValueError, match="share the shape"):
    xml_losses.svmr_nll(jnp.ones((2, 3)), jnp.ones((2, 4)), jnp.zeros(2, int),
                     jnp.zeros(2, int), jnp.ones((2, 3), bool))


@SETTINGS
@hypothesis.given(seed=st.integers(0, 2**31 - 1),
                  lengths=st.lists(st.integers(1, 6), min_size=4, max_size=4),
                  scale=st.sampled_from([0.1, 1.0, 10.0]))
def test_svmr_nll_loop_reference_and_padding_invariance(seed, lengths, scale):
  rng = np.random.default_rng(seed)
  n, width, extra = 4, 6, 3
  start = (scale * rng.normal(size=(n, width))).astype(np.float32)
  end = (scale * rng.normal(size=(n, width))).astype(np.float32)
  start_idx = np.array([rng.integers(0, length) for length in lengths])
  end_idx = np.array([rng.integers(0, length) for length in lengths])
  mask = _lengths_to_mask(lengths, width)
  got = _svmr_jit(start, end, start_idx, end_idx, mask)
  np.testing.assert_allclose(
      got, _ref_svmr_nll(start, end, start_idx, end_idx, lengths), rtol=1e-5, atol=1e-5)
  # Other padded logits and longer padding do not change the loss.
  repad = lambda x: np.concatenate(
      [np.where(mask, x, 1e3 * rng.normal(size=x.shape)),
       1e3 * rng.normal(size=(n, extra))], axis=1).astype(np.float32)
  np.testing.assert_allclose(
      _svmr_jit(repad(start), repad(end), start_idx, end_idx,
                _lengths_to_mask(lengths, width + extra)), got, rtol=1e-5)


def _sharded(mesh, x):
  return jax.device_put(x, NamedSharding(mesh, P("data", *([None] * (np.ndim(x) - 1)))))


@pytest.mark.slow  # `make test-slow` (CI runs it): the default run's 12-minute budget
def test_jit_grad_batch_2048_and_sharded_over_8_devices():
  rng = np.random.default_rng(0)
  n, clips, dim = 2048, 3, 8
  query = rng.normal(size=(n, 2, dim)).astype(np.float32)
  video = rng.normal(size=(n, 2, clips, dim)).astype(np.float32)
  mask = _lengths_to_mask(rng.integers(1, clips + 1, size=n), clips)
  start = rng.normal(size=(n, 16)).astype(np.float32)
  end = rng.normal(size=(n, 16)).astype(np.float32)
  span_mask = _lengths_to_mask(rng.integers(4, 17, size=n), 16)
  start_idx, end_idx = rng.integers(0, 4, size=n), rng.integers(0, 4, size=n)

  def loss(query, video, start, end, mask, span_mask, start_idx, end_idx):
    scores = xml_losses.video_retrieval_scores(query, video, mask)
    neg_video, neg_query = xml_losses.sample_negatives(
        jax.random.key(0), scores, hard_pool_size=20)
    return (xml_losses.video_retrieval_hinge(scores, neg_video, neg_query)
            + 0.01 * xml_losses.svmr_nll(start, end, start_idx, end_idx, span_mask))

  args = (query, video, start, end, mask, span_mask, start_idx, end_idx)
  value, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))(*args)
  assert np.isfinite(value) and value > 0
  for g in grads:
    assert np.all(np.isfinite(g)) and np.any(g != 0)

  devices = jax.devices()
  assert len(devices) == 8
  mesh = Mesh(np.array(devices), ("data",))
  value_sharded = jax.jit(loss)(*[_sharded(mesh, a) for a in args])
  np.testing.assert_allclose(value_sharded, value, rtol=1e-5)
