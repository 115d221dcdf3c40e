"""Moment decoding for XML: span scores (TVR eq. 7) and VCMR ranking (TVR eq. 8).

Spans are clip indices [start, end] with the end *inclusive*: a span covers
clips start..end, i.e. seconds [start * clip_len, (end + 1) * clip_len).

Length prior (TVR sec. 4.3): Lmin <= end - start + 1 <= Lmax, with Lmin = 2
and Lmax = 16 for TVR's 1.5 s clips. The official code
(jayleicn/TVRetrieval, `generate_min_max_length_mask`) keeps
min_l <= end - start < max_l instead, i.e. lengths 3..16 for min_l=2,
max_l=16; pass min_len=3, max_len=16 to reproduce its predictions.

Both functions score only the O(L * Lmax) spans that satisfy the prior and
never build the [L, L] start-end matrix.
"""
import jax
import jax.numpy as jnp


def _check_lengths(min_len: int, max_len: int, num_clips: int, name: str) -> int:
  """Returns the number of valid spans in a row of `num_clips` clips."""
  if not 1 <= min_len <= max_len:
    raise ValueError(f"{name}: need 1 <= min_len <= max_len, got min_len={min_len}, "
                     f"max_len={max_len}")
  if min_len > num_clips:
    raise ValueError(f"{name}: min_len={min_len} exceeds the {num_clips} clips per row")
  max_len = min(max_len, num_clips)
  return sum(num_clips - length + 1 for length in range(min_len, max_len + 1))


def top_spans(p_start: jax.Array, p_end: jax.Array, *, min_len: int,
              max_len: int, k: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The k best spans per row under the length prior, TVR eq. 7.

    s_svmr(st, ed) = P_st(st) * P_ed(ed),  Lmin <= ed - st + 1 <= Lmax

  Scores are computed on a band [L, Lmax - Lmin + 1] (one column per span
  length), so time and memory are O(L * Lmax). Equal scores are ranked by
  start, then by end (the order of a row-major scan of the start-end matrix).

  Args:
    p_start: [..., L] start probabilities P_st (softmax over real clips, so
      padding has probability 0).
    p_end: [..., L] end probabilities P_ed.
    min_len: Lmin in clips (TVR: 2).
    max_len: Lmax in clips (TVR: 16); lengths beyond L are skipped.
    k: spans to return per row (XML keeps 200 before NMS); at most the number
      of valid spans.

  Returns:
    (start [..., k] int32, end [..., k] int32 inclusive, score [..., k]),
    sorted by decreasing score.
  """
  if p_start.shape != p_end.shape or p_start.ndim < 1:
    raise ValueError(f"top_spans: p_start and p_end must share a shape [..., L], "
                     f"got {p_start.shape} and {p_end.shape}")
  num_clips = p_start.shape[-1]
  num_valid = _check_lengths(min_len, max_len, num_clips, "top_spans")
  if not 1 <= k <= num_valid:
    raise ValueError(f"top_spans: k={k} must be in [1, {num_valid}], the number of "
                     f"spans with {min_len} <= length <= {max_len} in {num_clips} clips")
  ends, in_range = _band(num_clips, min_len, max_len)
  end_probs = jnp.take(p_end, jnp.minimum(ends, num_clips - 1), axis=-1)  # [..., L, n_lengths]
  return _band_top_k(p_start[..., :, None] * end_probs, in_range, min_len, k)


def _band(num_clips: int, min_len: int, max_len: int) -> tuple[jax.Array, jax.Array]:
  """(end index [L, n_lengths] of the span starting at l with the j-th length, in range)."""
  lengths = jnp.arange(min_len, min(max_len, num_clips) + 1)
  ends = jnp.arange(num_clips)[:, None] + lengths[None, :] - 1
  return ends, ends < num_clips


def _band_top_k(band, in_range, min_len: int, k: int):
  """The k best (start, end, score) of a [..., L, n_lengths] band, row-major tie order."""
  num_lengths = band.shape[-1]
  band = jnp.where(in_range, band, -jnp.inf)
  flat = band.reshape(*band.shape[:-2], -1)  # start-major, then length = end order
  score, index = jax.lax.top_k(flat, k)
  start = (index // num_lengths).astype(jnp.int32)
  end = (start + min_len + index % num_lengths - 1).astype(jnp.int32)
  return start, end, score


def window_means(clip_scores: jax.Array, *, min_len: int, max_len: int) -> jax.Array:
  """[..., L, n_lengths] mean of `clip_scores` over each span (start l, j-th length).

  The sliding-window proposals of TVR Fig. 6's baseline: every span allowed
  by the length prior, scored by the average clip score inside it.
  Out-of-range spans are -inf.
  """
  num_clips = clip_scores.shape[-1]
  _check_lengths(min_len, max_len, num_clips, "window_means")
  ends, in_range = _band(num_clips, min_len, max_len)
  csum = jnp.concatenate([jnp.zeros_like(clip_scores[..., :1]),
                          jnp.cumsum(clip_scores, axis=-1)], axis=-1)  # [..., L + 1]
  upto = jnp.take(csum, jnp.minimum(ends, num_clips - 1) + 1, axis=-1)
  sums = upto - csum[..., :num_clips, None]
  lengths = (ends - jnp.arange(num_clips)[:, None] + 1).astype(clip_scores.dtype)
  return jnp.where(in_range, sums / lengths, -jnp.inf)


def top_windows(clip_scores: jax.Array, *, min_len: int, max_len: int, k: int
                ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """`top_spans` for sliding windows: the k spans with the best mean clip score."""
  num_valid = _check_lengths(min_len, max_len, clip_scores.shape[-1], "top_windows")
  if not 1 <= k <= num_valid:
    raise ValueError(f"top_windows: k={k} must be in [1, {num_valid}]")
  ends, in_range = _band(clip_scores.shape[-1], min_len, max_len)
  return _band_top_k(window_means(clip_scores, min_len=min_len, max_len=max_len), in_range,
                     min_len, k)


def vcmr_window_scores(video_scores: jax.Array, clip_scores: jax.Array, **kwargs):
  """`vcmr_scores` with sliding-window span scores (the mean of `clip_scores` [Q, V, L]
  over the span, TVR Fig. 6's baseline) in place of P_st(st) P_ed(ed)."""
  return vcmr_scores(video_scores, clip_scores, None, **kwargs)


def vcmr_scores(video_scores: jax.Array, p_start: jax.Array, p_end: jax.Array | None,
                *, top_n_videos: int, alpha: float, min_len: int, max_len: int,
                k: int) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """Ranks moments across a corpus, TVR eq. 8.

    s_vcmr(v_j, st, ed | q) = s_svmr(st, ed | v_j, q) * exp(alpha * s_vr(v_j | q))

  over the spans (eq. 7, with the length prior) of the `top_n_videos` videos
  with the highest s_vr (XML: top 100 videos, alpha = 20). A video's moments
  keep their eq. 7 order after the positive rescaling, so the k best moments
  are found among the k best spans of each retrieved video.

  Args:
    video_scores: [Q, V] video retrieval scores s_vr (TVR eq. 4, in [-1, 1]).
    p_start: [Q, V, L] start probabilities of every (query, video) pair.
    p_end: [Q, V, L] end probabilities.
    top_n_videos: number of videos kept per query (XML: 100).
    alpha: weight of the video score (XML: 20).
    min_len: Lmin in clips (TVR: 2).
    max_len: Lmax in clips (TVR: 16).
    k: moments returned per query (XML keeps 200 before NMS).

  Returns:
    (video [Q, k] int32 index into V, start [Q, k] int32, end [Q, k] int32
    inclusive, score [Q, k] s_vcmr), sorted by decreasing score.
  """
  if (video_scores.ndim != 2 or (p_end is not None and p_start.shape != p_end.shape)
      or p_start.shape[:2] != video_scores.shape):
    raise ValueError("vcmr_scores: expected video_scores [Q, V] and p_start, p_end "
                     f"[Q, V, L]; got {video_scores.shape}, {p_start.shape}, "
                     f"{p_end.shape}")
  if not 1 <= top_n_videos <= video_scores.shape[1]:
    raise ValueError(f"vcmr_scores: top_n_videos={top_n_videos} must be in "
                     f"[1, {video_scores.shape[1]}] (the number of videos)")
  num_valid = _check_lengths(min_len, max_len, p_start.shape[-1], "vcmr_scores")
  if not 1 <= k <= top_n_videos * num_valid:
    raise ValueError(f"vcmr_scores: k={k} must be in [1, {top_n_videos * num_valid}]"
                     f" ({num_valid} spans in each of {top_n_videos} videos)")
  vr_score, video = jax.lax.top_k(video_scores, top_n_videos)  # [Q, N]
  p_start = jnp.take_along_axis(p_start, video[..., None], axis=1)  # [Q, N, L]
  per_video = min(k, num_valid)
  if p_end is None:  # sliding windows over clip scores (`vcmr_window_scores`)
    start, end, span_score = top_windows(p_start, min_len=min_len, max_len=max_len,
                                         k=per_video)
  else:
    p_end = jnp.take_along_axis(p_end, video[..., None], axis=1)
    start, end, span_score = top_spans(p_start, p_end, min_len=min_len,
                                       max_len=max_len, k=per_video)  # [Q, N, kv]
  moment_score = span_score * jnp.exp(alpha * vr_score)[..., None]
  num_queries = video_scores.shape[0]
  score, index = jax.lax.top_k(moment_score.reshape(num_queries, -1), k)
  rank = index // per_video

  def pick(x):
    return jnp.take_along_axis(x.reshape(num_queries, -1), index, axis=1)

  return (jnp.take_along_axis(video, rank, axis=1).astype(jnp.int32),
          pick(start), pick(end), score)
