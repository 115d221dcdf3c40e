"""XML training losses for video corpus moment retrieval, TVR (Lei et al. 2020) sec. 4.3.

L_vcmr = L_vr + lambda * L_svmr with lambda = 0.01:

- `video_retrieval_hinge`: L_vr, eq. 5, on the video-level scores of eq. 4
  (`video_retrieval_scores`) with one sampled negative video and one sampled
  negative query per positive pair (`sample_negatives`).
- `svmr_nll`: L_svmr, eq. 6, the negative log-likelihood of the ground-truth
  start and end clips under the masked start/end softmax of ConvSE.
- `clip_bce`: in place of L_svmr for the sliding-window baseline of Fig. 6
  (`model.span_head="sliding"`), a per-clip binary cross-entropy.

Details the paper leaves open follow the official code (jayleicn/TVRetrieval,
baselines/crossmodal_moment_localization/model_xml.py): margin Delta = 0.1,
negatives drawn uniformly from the other in-batch items (or, for hard-negative
training, from the `hard_pool_size` highest-scoring ones), and padded clips
excluded from the max of eq. 4 and from the softmax of eq. 6.
"""
from typing import Optional

import jax
import jax.numpy as jnp

from avtext import ops


def video_retrieval_scores(query_emb: jax.Array, clip_emb: jax.Array,
                           clip_mask: jax.Array) -> jax.Array:
  """Video-level retrieval score s_vr, TVR eq. 4.

    s_vr(v | q) = 1/|M| sum_{m in M} max_l cos(H^m_0[l], q_m)

  the best cosine similarity between the modular query q_m and a real clip of
  the video, averaged over the modalities (M = {video, subtitle} in XML).

  Args:
    query_emb: [Nq, M, D] modular query vectors q_m.
    clip_emb: [Nv, M, L, D] clip features H^m_0 of each modality.
    clip_mask: [Nv, L] bool, True for real clips (shared by the modalities, as
      TVR's subtitle features are pooled on the video's clip grid). Every video
      needs a real clip, else its scores are -inf.

  Returns:
    [Nq, Nv] float32 scores in [-1, 1].
  """
  if (query_emb.ndim != 3 or clip_emb.ndim != 4
      or query_emb.shape[1:] != (clip_emb.shape[1], clip_emb.shape[3])
      or clip_mask.shape != (clip_emb.shape[0], clip_emb.shape[2])):
    raise ValueError(
        "video_retrieval_scores: expected query_emb [Nq, M, D], clip_emb "
        f"[Nv, M, L, D], clip_mask [Nv, L]; got {query_emb.shape}, "
        f"{clip_emb.shape}, {clip_mask.shape}")
  cos = jnp.einsum("qmd,vmld->qvml", ops.l2_normalize(query_emb),
                   ops.l2_normalize(clip_emb))
  cos = jnp.where(clip_mask[None, :, None, :].astype(bool), cos, -jnp.inf)
  return jnp.mean(jnp.max(cos, axis=-1), axis=-1)


def sample_negatives(rng: jax.Array, scores: jax.Array, *,
                     hard_pool_size: Optional[int] = None
                     ) -> tuple[jax.Array, jax.Array]:
  """Draws the negatives of TVR eq. 5 for each positive pair (q_i, v_i).

  For every i, a negative video j != i (from row i of `scores`) and a negative
  query z != i (from column i). Uniform over the other batch items by default;
  with `hard_pool_size` = P, uniform over the P highest-scoring other items
  (XML's hard-negative phase: P = 20 from epoch 20). Sampling does not depend
  on gradients.

  Args:
    rng: PRNG key.
    scores: [N, N] scores s_vr(v_j | q_i), positives on the diagonal; N >= 2.
    hard_pool_size: P, or None for uniform sampling.

  Returns:
    (neg_video_idx [N], neg_query_idx [N]) int32 indices into the batch.
  """
  n = scores.shape[0]
  if scores.ndim != 2 or scores.shape[1] != n or n < 2:
    raise ValueError("sample_negatives: expected square scores [N, N] with N >= 2 "
                     f"(each positive needs an in-batch negative), got {scores.shape}")
  if hard_pool_size is not None and hard_pool_size < 1:
    raise ValueError(f"sample_negatives: hard_pool_size must be >= 1, got {hard_pool_size}")
  rng_video, rng_query = jax.random.split(rng)
  rows = jnp.arange(n)
  if hard_pool_size is None:
    # i + r mod N with r uniform in [1, N) is uniform over j != i.
    neg_video = (rows + jax.random.randint(rng_video, (n,), 1, n)) % n
    neg_query = (rows + jax.random.randint(rng_query, (n,), 1, n)) % n
    return neg_video.astype(jnp.int32), neg_query.astype(jnp.int32)

  pool = min(hard_pool_size, n - 1)
  scores = jax.lax.stop_gradient(scores)
  # The positive is pushed to rank 0 so that ranks 1..pool are the hardest negatives.
  eye = jnp.eye(n, dtype=bool)

  def draw(rng, anchored_scores):
    _, ranked = jax.lax.top_k(jnp.where(eye, jnp.inf, anchored_scores), pool + 1)
    rank = jax.random.randint(rng, (n,), 1, pool + 1)
    return jnp.take_along_axis(ranked, rank[:, None], axis=1)[:, 0]

  return (draw(rng_video, scores).astype(jnp.int32),
          draw(rng_query, scores.T).astype(jnp.int32))


def video_retrieval_hinge(scores: jax.Array, neg_video_idx: jax.Array,
                          neg_query_idx: jax.Array, *,
                          margin: float = 0.1) -> jax.Array:
  """Video retrieval loss L_vr, TVR eq. 5.

    L_vr = 1/n sum_i [ max(0, Delta + s_vr(v_j | q_i) - s_vr(v_i | q_i))
                     + max(0, Delta + s_vr(v_i | q_z) - s_vr(v_i | q_i)) ]

  Args:
    scores: [N, N] s_vr(v_j | q_i) from `video_retrieval_scores`, positive
      pairs on the diagonal.
    neg_video_idx: [N] index j of the negative video of query i.
    neg_query_idx: [N] index z of the negative query of video i.
    margin: Delta (XML: 0.1).

  Returns:
    Scalar float32 loss.
  """
  n = scores.shape[0]
  if scores.ndim != 2 or scores.shape[1] != n:
    raise ValueError(f"video_retrieval_hinge: expected square scores [N, N], got {scores.shape}")
  if neg_video_idx.shape != (n,) or neg_query_idx.shape != (n,):
    raise ValueError("video_retrieval_hinge: expected one negative video and one "
                     f"negative query per pair, shape ({n},), got "
                     f"{neg_video_idx.shape} and {neg_query_idx.shape}")
  scores = scores.astype(jnp.promote_types(scores.dtype, jnp.float32))
  rows = jnp.arange(n)
  positive = jnp.diagonal(scores)
  neg_video = scores[rows, neg_video_idx]  # s_vr(v_j | q_i)
  neg_query = scores[neg_query_idx, rows]  # s_vr(v_i | q_z)
  return jnp.mean(jax.nn.relu(margin + neg_video - positive)
                  + jax.nn.relu(margin + neg_query - positive))


def svmr_nll(start_logits: jax.Array, end_logits: jax.Array,
             start_idx: jax.Array, end_idx: jax.Array,
             mask: jax.Array) -> jax.Array:
  """Single video moment retrieval loss L_svmr, TVR eq. 6.

    L_svmr = -1/n sum_i [ log P_st^i(t_st^i) + log P_ed^i(t_ed^i) ]

  with P_st, P_ed the softmax of the ConvSE start/end scores over the real
  clips of each video (padding gets probability 0).

  Args:
    start_logits: [N, L] start scores S_st.
    end_logits: [N, L] end scores S_ed.
    start_idx: [N] ground-truth start clip t_st (a real clip).
    end_idx: [N] ground-truth end clip t_ed, inclusive (a real clip).
    mask: [N, L] bool, True for real clips.

  Returns:
    Scalar float32 loss.
  """
  if start_logits.shape != end_logits.shape or start_logits.shape != mask.shape:
    raise ValueError("svmr_nll: start_logits, end_logits and mask must share the "
                     f"shape [N, L], got {start_logits.shape}, {end_logits.shape}, "
                     f"{mask.shape}")
  mask = mask.astype(bool)

  def nll(logits, idx):
    logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
    log_p = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(log_p, idx[:, None].astype(jnp.int32), axis=-1)[:, 0]

  return jnp.mean(nll(start_logits, start_idx) + nll(end_logits, end_idx))


def clip_bce(logits: jax.Array, start: jax.Array, end: jax.Array,
             mask: jax.Array) -> jax.Array:
  """Mean over real clips of BCE(sigmoid(logit), clip inside [start, end]) (Fig. 6 baseline).

  Args:
    logits: [N, L] per-clip scores.
    start, end: [N] ground-truth start / end clip (inclusive).
    mask: [N, L], nonzero for real clips.

  Returns:
    Scalar float32 loss.
  """
  pos = jnp.arange(logits.shape[-1])[None]
  label = ((pos >= start[:, None]) & (pos <= end[:, None])).astype(jnp.float32)
  mask = mask.astype(jnp.float32)
  x = jnp.where(mask > 0, logits, 0.0).astype(jnp.float32)
  loss = jnp.maximum(x, 0) - x * label + jnp.log1p(jnp.exp(-jnp.abs(x)))
  return jnp.sum(loss * mask) / jnp.maximum(jnp.sum(mask), 1.0)
