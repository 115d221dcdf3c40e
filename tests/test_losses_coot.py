"""Tests for avtext.losses.coot (COOT eq. 1-3, 6-8).

Reference numbers marked "official" were produced by running the official
COOT loss code (gingsi/coot-videotext, coot/loss_fn.py: ContrastiveLoss and
CycleConsistencyLoss, use_cuda=False) with torch 2.13.0 CPU in a scratch
directory outside this repository, on the inputs built by `_cycle_inputs` and
`_alignment_inputs` below (numpy default_rng with the seeds stated there; the
input checksums guard against a change of the random stream). Only those
inputs and outputs are kept here.
"""
import hypothesis
import hypothesis.strategies as st
import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from avtext.losses import coot

SETTINGS = hypothesis.settings(max_examples=25, deadline=None)


# --------------------------------------------------------------------------
# Slow loop references (numpy), written from the official behaviour.


def _ref_cycle_errors(start, start_len, other, other_len):
  """Per-element |i - mu|^2 for one start -> other -> start cycle, loops only."""
  batch, length, _ = start.shape
  errors = np.zeros((batch, length))
  for b in range(batch):
    s = start[b, :start_len[b]].astype(np.float64)
    o = other[b, :other_len[b]].astype(np.float64)
    for i in range(len(s)):
      # eq. 6 with the mean (not sum) squared distance, temperature 1.
      logits = np.array([-np.mean((s[i] - o[j]) ** 2) for j in range(len(o))])
      w = np.exp(logits - logits.max())
      w /= w.sum()
      nn = sum(w[j] * o[j] for j in range(len(o)))
      # eq. 7: soft location of the neighbour back in the start sequence.
      logits = np.array([-np.mean((nn - s[j]) ** 2) for j in range(len(s))])
      beta = np.exp(logits - logits.max())
      beta /= beta.sum()
      mu = sum(beta[j] * j for j in range(len(s)))
      errors[b, i] = (i - mu) ** 2  # eq. 8
  return errors


def _ref_cycle_consistency(clip, clip_len, sent, sent_len):
  """Official CycleConsistencyLoss(num_samples=-1): clip_clip + sent_sent."""
  clip_err = _ref_cycle_errors(clip, clip_len, sent, sent_len)
  sent_err = _ref_cycle_errors(sent, sent_len, clip, clip_len)
  return (np.mean(clip_err.sum(1) / clip_len)
          + np.mean(sent_err.sum(1) / sent_len))


def _ref_hinge(x, y, margin):
  """Official ContrastiveLoss(norm=True) on normalised x, y, with loops."""
  x = x / np.linalg.norm(x, axis=1, keepdims=True)
  y = y / np.linalg.norm(y, axis=1, keepdims=True)
  n = len(x)
  total = 0.0
  for i in range(n):
    for j in range(n):
      if i != j:
        total += max(0.0, margin + x[i] @ y[j] - x[i] @ y[i])
        total += max(0.0, margin + x[i] @ y[j] - x[j] @ y[j])
  return total / (n * n)


def _lengths_to_mask(lengths, size):
  return np.arange(size)[None, :] < np.asarray(lengths)[:, None]


# --------------------------------------------------------------------------
# Fixtures from the official code.


def _cycle_inputs():
  rng = np.random.default_rng(20240607)
  clip = rng.normal(size=(4, 5, 8)).astype(np.float32)
  sent = rng.normal(size=(4, 6, 8)).astype(np.float32)
  clip_len, sent_len = np.array([5, 3, 1, 4]), np.array([2, 6, 3, 1])
  np.testing.assert_allclose([clip.sum(), sent.sum()], [-22.247551, 10.648731],
                             rtol=1e-6, err_msg="numpy random stream changed")
  return clip, clip_len, sent, sent_len


_OFFICIAL_CLIP_ERR = np.array([
    [6.8993382e+00, 2.3576608e+00, 8.8731664e-01, 1.6063165e-03, 1.2788737e+00],
    [4.7679210e-01, 1.1185158e-01, 1.5679168e+00, 0, 0],
    [0, 0, 0, 0, 0],
    [5.4174960e-01, 6.9676772e-02, 1.5976039e+00, 5.1255317e+00, 0]])
_OFFICIAL_SENT_ERR = np.array([
    [7.2448649e-02, 1.4557914e-01, 0, 0, 0, 0],
    [5.0213809e+00, 1.6389346e+00, 5.6697652e-02, 5.3890717e-01, 2.4485462e+00,
     7.6127300e+00],
    [9.0478778e-01, 2.3811134e-03, 1.0999744e+00, 0, 0, 0],
    [0, 0, 0, 0, 0, 0]])
# CycleConsistencyLoss(num_samples=-1): (clip_clip_loss, sent_sent_loss).
_OFFICIAL_AVERAGED = (1.209363341331482, 0.9160653352737427)
# Default CycleConsistencyLoss() (num_samples=1) after torch.manual_seed(0):
# torch.multinomial picked clips [2, 1, 0, 2] and sentences [0, 3, 1, 0].
_OFFICIAL_SAMPLED = (0.6491930484771729, 0.15343423187732697)
_OFFICIAL_PICKS = (np.array([2, 1, 0, 2]), np.array([0, 3, 1, 0]))


def _alignment_inputs():
  rng = np.random.default_rng(7)
  vid, par, vctx, pctx = (rng.normal(size=(5, 3)).astype(np.float32) for _ in range(4))
  clips = rng.normal(size=(5, 3, 3)).astype(np.float32)
  sents = rng.normal(size=(5, 3, 3)).astype(np.float32)
  np.testing.assert_allclose(
      [x.sum() for x in (vid, par, vctx, pctx, clips, sents)],
      [-2.0309703, -10.39112, -3.001162, 2.8624334, -4.3594985, -6.6754494],
      rtol=1e-5, err_msg="numpy random stream changed")
  mask = _lengths_to_mask([3, 1, 2, 3, 2], 3)
  return vid, par, vctx, pctx, clips, sents, mask


# Official ContrastiveLoss(0.2) on F.normalize'd inputs, clips packed to the
# real ones, clustering = (loss(v, v) + loss(t, t)) / 2 as in trainer_retrieval.
_OFFICIAL_TERMS = {
    "align_high": 1.0129715204238892, "align_low": 0.5548126697540283,
    "align_context": 0.8835369944572449, "cluster_high": 0.009921737015247345,
    "cluster_low": 0.024491220712661743}


def test_cycle_errors_match_official_fixture():
  clip, clip_len, sent, sent_len = _cycle_inputs()
  clip_err, sent_err = coot.cycle_consistency_errors(
      clip, _lengths_to_mask(clip_len, 5), sent, _lengths_to_mask(sent_len, 6))
  np.testing.assert_allclose(clip_err, _OFFICIAL_CLIP_ERR, rtol=2e-5, atol=1e-6)
  np.testing.assert_allclose(sent_err, _OFFICIAL_SENT_ERR, rtol=2e-5, atol=1e-6)


def test_cycle_consistency_matches_official_fixture_and_loop_reference():
  clip, clip_len, sent, sent_len = _cycle_inputs()
  got = coot.cycle_consistency(clip, _lengths_to_mask(clip_len, 5),
                               sent, _lengths_to_mask(sent_len, 6))
  np.testing.assert_allclose(got, sum(_OFFICIAL_AVERAGED), rtol=1e-5)
  np.testing.assert_allclose(
      got, _ref_cycle_consistency(clip, clip_len, sent, sent_len), rtol=1e-5)


def test_cycle_errors_reproduce_official_sampled_loss_at_its_picks():
  clip, clip_len, sent, sent_len = _cycle_inputs()
  clip_err, sent_err = coot.cycle_consistency_errors(
      clip, _lengths_to_mask(clip_len, 5), sent, _lengths_to_mask(sent_len, 6))
  rows = np.arange(4)
  np.testing.assert_allclose(
      [np.mean(np.asarray(clip_err)[rows, _OFFICIAL_PICKS[0]]),
       np.mean(np.asarray(sent_err)[rows, _OFFICIAL_PICKS[1]])],
      _OFFICIAL_SAMPLED, rtol=1e-5)


def test_cycle_consistency_hand_worked():
  # Clips c0 = (0, 0), c1 = (1, 1); one sentence s0 = (0, 0).
  # Clip cycle: both clips go to s0, which lands at mu = e^-1 / (1 + e^-1)
  # among the clips (mean squared distance 1 to c1, not the summed 2).
  # Sentence cycle: a single sentence always comes back to index 0.
  clip = np.array([[[0.0, 0.0], [1.0, 1.0]]], np.float32)
  sent = np.array([[[0.0, 0.0], [5.0, -5.0]]], np.float32)  # 2nd is padding
  mu = 1.0 / (1.0 + np.e)
  expected = (mu ** 2 + (1 - mu) ** 2) / 2 + 0.0
  got = coot.cycle_consistency(clip, np.array([[True, True]]),
                               sent, np.array([[True, False]]))
  np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_cycle_consistency_perfectly_separated_is_zero():
  # Identical, far-apart clips and sentences: every cycle returns home.
  points = np.array([[[0.0], [30.0], [60.0]]], np.float32)
  mask = np.ones((1, 3), bool)
  np.testing.assert_allclose(
      coot.cycle_consistency(points, mask, points, mask), 0.0, atol=1e-6)


def test_cycle_consistency_sampled_form_picks_real_elements_uniformly():
  clip, clip_len, sent, sent_len = _cycle_inputs()
  clip_mask, sent_mask = _lengths_to_mask(clip_len, 5), _lengths_to_mask(sent_len, 6)
  clip_err, sent_err = map(np.asarray, coot.cycle_consistency_errors(
      clip, clip_mask, sent, sent_mask))
  # With one sequence, the sampled loss is one real element's error.
  one = lambda key: coot.cycle_consistency(clip[:1], clip_mask[:1], sent[:1],
                                           sent_mask[:1], rng=key)
  values = np.asarray(jax.jit(jax.vmap(one))(jax.random.split(jax.random.key(0), 400)))
  candidates = (clip_err[0, :5, None] + sent_err[0, None, :2]).ravel()
  assert np.all(np.min(np.abs(values[:, None] - candidates[None]), axis=1) < 1e-5)
  assert len(np.unique(np.round(values, 5))) == 10  # all 5 x 2 combinations
  # Its expectation is the averaged form (CycleConsistencyLoss(num_samples=-1)).
  many = jax.jit(jax.vmap(lambda key: coot.cycle_consistency(
      clip, clip_mask, sent, sent_mask, rng=key)))(jax.random.split(jax.random.key(1), 2000))
  np.testing.assert_allclose(np.mean(many), sum(_OFFICIAL_AVERAGED), rtol=0.03)


# Fixed padded shapes (lengths vary through the masks) keep the number of
# compilations, and the test time, small.
_cycle_jit = jax.jit(coot.cycle_consistency)


@SETTINGS
@hypothesis.given(seed=st.integers(0, 2**31 - 1),
                  clip_len=st.lists(st.integers(1, 5), min_size=3, max_size=3),
                  sent_len=st.lists(st.integers(1, 4), min_size=3, max_size=3))
def test_cycle_consistency_loop_reference_and_padding_invariance(
    seed, clip_len, sent_len):
  rng = np.random.default_rng(seed)
  batch, max_clips, max_sents, extra_pad, dim = 3, 5, 4, 2, 3
  clip = rng.normal(size=(batch, max_clips, dim)).astype(np.float32)
  sent = rng.normal(size=(batch, max_sents, dim)).astype(np.float32)
  clip_mask = _lengths_to_mask(clip_len, max_clips)
  sent_mask = _lengths_to_mask(sent_len, max_sents)
  got = _cycle_jit(clip, clip_mask, sent, sent_mask)
  np.testing.assert_allclose(
      got, _ref_cycle_consistency(clip, np.array(clip_len), sent, np.array(sent_len)),
      rtol=1e-4, atol=1e-6)
  # Different padding values and more padding leave the loss unchanged.
  pad = lambda x: np.concatenate(
      [x, rng.normal(size=(batch, extra_pad, dim)).astype(np.float32) * 10], axis=1)
  noisy = lambda x, m: np.where(m[..., None], x, 100 * rng.normal(size=x.shape)).astype(np.float32)
  repadded = _cycle_jit(
      pad(noisy(clip, clip_mask)), _lengths_to_mask(clip_len, max_clips + extra_pad),
      pad(noisy(sent, sent_mask)), _lengths_to_mask(sent_len, max_sents + extra_pad))
  np.testing.assert_allclose(repadded, got, rtol=1e-5, atol=1e-6)


@SETTINGS
@hypothesis.given(seed=st.integers(0, 2**31 - 1))
def test_cycle_consistency_invariant_to_batch_permutation(seed):
  rng = np.random.default_rng(seed)
  batch = 5
  clip = rng.normal(size=(batch, 4, 3)).astype(np.float32)
  sent = rng.normal(size=(batch, 3, 3)).astype(np.float32)
  clip_mask = _lengths_to_mask(rng.integers(1, 5, size=batch), 4)
  sent_mask = _lengths_to_mask(rng.integers(1, 4, size=batch), 3)
  perm = rng.permutation(batch)
  np.testing.assert_allclose(
      _cycle_jit(clip[perm], clip_mask[perm], sent[perm], sent_mask[perm]),
      _cycle_jit(clip, clip_mask, sent, sent_mask), rtol=1e-5)


def test_hierarchical_alignment_matches_official_fixture():
  vid, par, vctx, pctx, clips, sents, mask = _alignment_inputs()
  total, terms = coot.hierarchical_alignment(vid, par, vctx, pctx, clips, sents, mask)
  for name, value in _OFFICIAL_TERMS.items():
    np.testing.assert_allclose(terms[name], value, rtol=1e-5, err_msg=name)
  np.testing.assert_allclose(total, sum(_OFFICIAL_TERMS.values()), rtol=1e-5)
  total_weighted, _ = coot.hierarchical_alignment(
      vid, par, vctx, pctx, clips, sents, mask, weight_low=0.0, weight_high_cluster=2.0)
  np.testing.assert_allclose(
      total_weighted, sum(_OFFICIAL_TERMS.values()) - _OFFICIAL_TERMS["align_low"]
      + _OFFICIAL_TERMS["cluster_high"], rtol=1e-5)


def test_alignment_hand_worked():
  # x1 = (1, 0), y1 = (1, 0); x2 = (0, 1), y2 = (1, 1)/sqrt 2 (scaled: cosine is
  # scale-free). S = [[1, c], [0, c]] with c = 1/sqrt 2. The only active hinge
  # is anchor y2 against x1: 0.2 + S12 - S22 = 0.2; divided by B^2 = 4.
  x = np.array([[3.0, 0.0], [0.0, 0.5]], np.float32)
  y = np.array([[2.0, 0.0], [4.0, 4.0]], np.float32)
  np.testing.assert_allclose(coot.alignment(x, y), 0.05, rtol=1e-6)
  # A padded third pair, however close to the others, changes nothing.
  x_pad = np.concatenate([x, [[1.0, 0.01]]]).astype(np.float32)
  y_pad = np.concatenate([y, [[1.0, 0.0]]]).astype(np.float32)
  np.testing.assert_allclose(
      coot.alignment(x_pad, y_pad, np.array([True, True, False])), 0.05, rtol=1e-6)
  # Clustering: cos(x1, x2) = 0 gives no visual hinge; text y1 = (2, 0),
  # y2 = (4, 1) have cosine c = 4 / sqrt 17, so all 4 text hinges are
  # 0.2 + c - 1; over B^2 = 4, then halved.
  y = np.array([[2.0, 0.0], [4.0, 1.0]], np.float32)
  c = 4 / np.sqrt(17)
  np.testing.assert_allclose(coot.clustering(x, y), 0.5 * (0.2 + c - 1), rtol=1e-5)


_alignment_jit = jax.jit(lambda x, y, m, margin: coot.alignment(x, y, m, margin=margin))
_clustering_jit = jax.jit(lambda x, y, m, margin: coot.clustering(x, y, m, margin=margin))


@SETTINGS
@hypothesis.given(seed=st.integers(0, 2**31 - 1), margin=st.floats(0.0, 1.0))
def test_masked_alignment_and_clustering_match_packed_loop_reference(seed, margin):
  rng = np.random.default_rng(seed)
  batch, clips = 4, 3
  x = rng.normal(size=(batch, clips, 3)).astype(np.float32)
  y = (x + rng.normal(size=x.shape)).astype(np.float32)
  mask = _lengths_to_mask(rng.integers(1, clips + 1, size=batch), clips)
  xs, ys = x[mask].astype(np.float64), y[mask].astype(np.float64)
  np.testing.assert_allclose(_alignment_jit(x, y, mask, margin),
                             _ref_hinge(xs, ys, margin), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(
      _clustering_jit(x, y, mask, margin),
      0.5 * (_ref_hinge(xs, xs, margin) + _ref_hinge(ys, ys, margin)),
      rtol=1e-4, atol=1e-6)


_hierarchical_jit = jax.jit(lambda *args: coot.hierarchical_alignment(*args)[0])


@SETTINGS
@hypothesis.given(seed=st.integers(0, 2**31 - 1))
def test_hierarchical_alignment_invariant_to_batch_permutation(seed):
  rng = np.random.default_rng(seed)
  batch = 5
  flat = [rng.normal(size=(batch, 4)).astype(np.float32) for _ in range(4)]
  clips = rng.normal(size=(batch, 3, 4)).astype(np.float32)
  sents = rng.normal(size=(batch, 3, 4)).astype(np.float32)
  mask = _lengths_to_mask(rng.integers(1, 4, size=batch), 3)
  perm = rng.permutation(batch)
  total = _hierarchical_jit(*flat, clips, sents, mask)
  permuted = _hierarchical_jit(
      *[f[perm] for f in flat], clips[perm], sents[perm], mask[perm])
  np.testing.assert_allclose(permuted, total, rtol=1e-5)


def test_invalid_shapes_raise():
  with pytest.raises(ValueError, match="same shape"):
    coot.alignment(np.ones((3, 4)), np.ones((3, 5)))
  with pytest.raises(ValueError, match="mask shape"):
    coot.alignment(np.ones((3, 2, 4)), np.ones((3, 2, 4)), np.ones((3,), bool))
  with pytest.raises(ValueError, match=r"\[B, L, D\]"):
    coot.cycle_consistency(np.ones((3, 4)), np.ones((3, 4), bool),
                           np.ones((3, 2, 4)), np.ones((3, 2), bool))


def _sharded(mesh, x):
  spec = P("data", *([None] * (np.ndim(x) - 1)))
  return jax.device_put(x, NamedSharding(mesh, spec))


@pytest.mark.slow  # `make test-slow` (CI runs it): the default run's 12-minute budget
def test_jit_grad_batch_2048_and_sharded_over_8_devices():
  rng = np.random.default_rng(0)
  batch, clips, dim = 2048, 2, 16
  flat = [rng.normal(size=(batch, dim)).astype(np.float32) for _ in range(4)]
  clip = rng.normal(size=(batch, clips, dim)).astype(np.float32)
  sent = rng.normal(size=(batch, clips, dim)).astype(np.float32)
  mask = _lengths_to_mask(rng.integers(1, clips + 1, size=batch), clips)
  sent_cc = rng.normal(size=(batch, 3, dim)).astype(np.float32)
  sent_mask = _lengths_to_mask(rng.integers(1, 4, size=batch), 3)

  def loss(flat, clip, sent, sent_cc):
    total, _ = coot.hierarchical_alignment(*flat, clip, sent, mask)
    return total + 0.01 * coot.cycle_consistency(
        clip, mask, sent_cc, sent_mask, rng=jax.random.key(3))

  value, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))(
      flat, clip, sent, sent_cc)
  assert np.isfinite(value) and value > 0
  for g in jax.tree.leaves(grads):
    assert np.all(np.isfinite(g)) and np.any(g != 0)

  devices = jax.devices()
  assert len(devices) == 8
  mesh = Mesh(np.array(devices), ("data",))
  sharded = jax.tree.map(lambda x: _sharded(mesh, x), (flat, clip, sent, sent_cc))
  value_sharded = jax.jit(loss)(*sharded)
  np.testing.assert_allclose(value_sharded, value, rtol=1e-5)
  averaged = jax.jit(coot.cycle_consistency)(
      _sharded(mesh, clip), _sharded(mesh, mask), _sharded(mesh, sent_cc),
      _sharded(mesh, sent_mask))
  np.testing.assert_allclose(
      averaged, coot.cycle_consistency(clip, mask, sent_cc, sent_mask), rtol=1e-5)
