"""Retrieval metrics: R@K, median / mean rank, mAP, and S-MiT's 1k-subset protocol.

Host-side numpy, except `in_batch_metrics` (jnp, inside the jitted train step).
A similarity matrix `sim  # [Q, N]` scores every query
(row) against every item (column); higher is more similar. The trainer calls
`retrieval_metrics(sim)` for text->video and `retrieval_metrics(sim.T)` for
video->text.

Ranks are 1-based (rank 1 = best) and ties are counted pessimistically: an
incorrect item with exactly the same score as the correct one is ranked ahead
of it. So a constant similarity matrix gives every query rank N, not 1, and a
degenerate model cannot score well by collapsing all embeddings onto one point.
Codes that rank with `np.argsort` (COOT) break ties arbitrarily instead; the two
agree whenever scores are distinct.
"""
from typing import Dict, Iterable, Optional, Sequence, Tuple, Union

import jax.numpy as jnp
import numpy as np

GroundTruth = Union[None, np.ndarray, Sequence[Iterable[int]]]

# Rows compared per block when counting: bounds the boolean temporary to
# ~16 MiB for N = 10k and keeps each block in cache.
_BLOCK_ELEMENTS = 1 << 24

MEDIAN_CONVENTIONS = ("plain", "coot")


def _as_float_matrix(sim) -> np.ndarray:
  sim = np.asarray(sim)
  if sim.ndim != 2:
    raise ValueError(f"expected a similarity matrix [Q, N], got shape {sim.shape}")
  if sim.shape[0] == 0 or sim.shape[1] == 0:
    raise ValueError(f"empty similarity matrix of shape {sim.shape}")
  if sim.dtype not in (np.float32, np.float64):
    # bfloat16 / float16 / integer scores: compare in float32.
    sim = sim.astype(np.float32)
  if np.isnan(sim).any():
    raise ValueError("similarity matrix contains NaN; ranks would be undefined")
  return sim


def _count_at_least(sim: np.ndarray, threshold: np.ndarray) -> np.ndarray:
  """counts[q] = #{j : sim[q, j] >= threshold[q]}, in blocks of rows."""
  num_queries, num_items = sim.shape
  counts = np.empty(num_queries, dtype=np.int64)
  if not sim.flags.c_contiguous and sim.T.flags.c_contiguous:
    # sim is a transposed view (e.g. sim.T for video->text): walk the
    # contiguous layout, where queries are columns, block of items by block.
    sim_t = sim.T  # [N, Q], C-contiguous
    counts[:] = 0
    step = max(1, _BLOCK_ELEMENTS // num_queries)
    for start in range(0, num_items, step):
      block = sim_t[start:start + step]
      # A column-wise int32 sum of the booleans beats count_nonzero(axis=0).
      counts += (block >= threshold[None, :]).sum(axis=0, dtype=np.int32)
    return counts
  step = max(1, _BLOCK_ELEMENTS // num_items)
  for start in range(0, num_queries, step):
    block = sim[start:start + step]
    counts[start:start + step] = np.count_nonzero(
        block >= threshold[start:start + step, None], axis=1)
  return counts


def _ground_truth_pairs(gt: GroundTruth, num_queries: int,
                        num_items: int) -> Tuple[np.ndarray, np.ndarray, bool]:
  """Flattens gt into unique (query, item) index pairs, sorted by query.

  Returns (query_idx, item_idx, one_per_query).
  """
  if gt is None:
    if num_queries > num_items:
      raise ValueError(
          f"gt=None means query q matches item q, but there are {num_queries}"
          f" queries and only {num_items} items; pass gt explicitly")
    idx = np.arange(num_queries)
    return idx, idx, True
  if not isinstance(gt, (list, tuple)):
    gt = np.asarray(gt)  # jax arrays and the like
  if isinstance(gt, np.ndarray) and gt.dtype.kind in "iu" and gt.ndim in (1, 2):
    if gt.shape[0] != num_queries or gt.size == 0:
      raise ValueError(f"gt of shape {gt.shape} does not give a correct item to"
                       f" each of {num_queries} queries")
    if gt.ndim == 1:
      query_idx, item_idx, one_per_query = np.arange(num_queries), gt, True
    else:
      query_idx = np.repeat(np.arange(num_queries), gt.shape[1])
      item_idx, one_per_query = gt.reshape(-1), gt.shape[1] == 1
  else:
    if len(gt) != num_queries:
      raise ValueError(f"gt has {len(gt)} entries for {num_queries} queries")
    # A bare int entry is one correct item; anything else an iterable of them.
    items = [sorted({int(i) for i in ([g] if isinstance(g, (int, np.integer)) else g)})
             for g in gt]
    empty = [q for q, g in enumerate(items) if not g]
    if empty:
      raise ValueError(
          f"gt lists no correct item for {len(empty)} queries (first: {empty[:5]})")
    lengths = np.fromiter((len(g) for g in items), np.int64, num_queries)
    query_idx = np.repeat(np.arange(num_queries), lengths)
    item_idx = np.fromiter((i for g in items for i in g), np.int64, lengths.sum())
    one_per_query = bool((lengths == 1).all())
  item_idx = np.asarray(item_idx, dtype=np.int64)
  if item_idx.size and (item_idx.min() < 0 or item_idx.max() >= num_items):
    raise ValueError(f"gt item indices must lie in [0, {num_items}), got range"
                     f" [{item_idx.min()}, {item_idx.max()}]")
  if not one_per_query:
    pairs = np.unique(np.stack([query_idx, item_idx], axis=1), axis=0)
    query_idx, item_idx = pairs[:, 0], pairs[:, 1]
  return query_idx, item_idx, one_per_query


def retrieval_ranks(sim, *, gt: GroundTruth = None) -> np.ndarray:
  """1-based rank of the best-ranked correct item for every query.

  rank_q = 1 + #{incorrect j : sim[q, j] >= max_{c in gt_q} sim[q, c]}

  i.e. pessimistic ties (see the module docstring). No sort: one vectorised
  pass counting the items that score at least the best correct item.

  Args:
    sim: [Q, N] similarities.
    gt: None (query q matches item q), an int array [Q] (one correct item per
      query), an int array [Q, K] or a list of Q iterables of item indices
      (several correct items per query; the best one counts).

  Returns:
    int64 array [Q] of ranks in [1, N].
  """
  sim = _as_float_matrix(sim)
  num_queries, num_items = sim.shape
  query_idx, item_idx, one_per_query = _ground_truth_pairs(gt, num_queries,
                                                           num_items)
  correct_scores = sim[query_idx, item_idx]
  if one_per_query:
    # The count includes the correct item itself, hence exactly the rank.
    return _count_at_least(sim, correct_scores)
  starts = np.flatnonzero(np.r_[True, query_idx[1:] != query_idx[:-1]])
  best = np.maximum.reduceat(correct_scores, starts)
  # Correct items tied with the best one are not ranked ahead of it.
  correct_at_best = np.bincount(
      query_idx, weights=correct_scores >= best[query_idx],
      minlength=num_queries).astype(np.int64)
  return _count_at_least(sim, best) - correct_at_best + 1


def median_rank(ranks: np.ndarray, convention: str = "plain") -> float:
  """Median of 1-based ranks under one of two published conventions.

  "plain": np.median of the 1-based ranks, which is x.5 when Q is even and the
    two middle ranks differ. This is what the video-text retrieval code that
    VideoCC compares with reports as MdR (np.median(ranks0) + 1 with 0-based
    ranks; VideoCC's and TVR's own tables give only R@K).
  "coot": COOT's MedR, np.floor(np.median(ranks0)) + 1 with 0-based ranks
    (nntrainer/retrieval.py of the official code), which equals
    floor(plain median): always an integer, and 0.5 lower than "plain" when
    the two middle ranks differ by an odd number.

  Args:
    ranks: 1-based ranks, e.g. from `retrieval_ranks`.
    convention: "plain" or "coot".

  Returns:
    The median rank as a float.
  """
  if convention not in MEDIAN_CONVENTIONS:
    raise ValueError(f"median convention must be one of {MEDIAN_CONVENTIONS},"
                     f" got {convention!r}")
  median = float(np.median(ranks))
  return float(np.floor(median)) if convention == "coot" else median


def retrieval_metrics(sim, *, gt: GroundTruth = None,
                      ks: Sequence[int] = (1, 5, 10),
                      median_convention: str = "plain") -> Dict[str, float]:
  """Recall at K, median rank and mean rank of a [Q, N] similarity matrix.

    R@K = 100 / Q * #{q : rank_q <= K}          (percent)
    MdR = median_q rank_q                        (see `median_rank`)
    MnR = 1 / Q * sum_q rank_q

  with 1-based, pessimistically tied ranks from `retrieval_ranks` (rank of the
  best correct item when a query has several).

  Args:
    sim: [Q, N] similarities, queries as rows.
    gt: correct item(s) per query; see `retrieval_ranks`. None: the diagonal.
    ks: cut-offs K for R@K.
    median_convention: "plain" (default) or "coot"; see `median_rank`.

  Returns:
    {"R@1": ..., "R@5": ..., "R@10": ..., "MdR": ..., "MnR": ...} as floats.
  """
  if median_convention not in MEDIAN_CONVENTIONS:
    raise ValueError(f"median_convention must be one of {MEDIAN_CONVENTIONS},"
                     f" got {median_convention!r}")
  if any(int(k) != k or k < 1 for k in ks):
    raise ValueError(f"ks must be positive integers, got {tuple(ks)}")
  ranks = retrieval_ranks(sim, gt=gt)
  metrics = {f"R@{k}": 100.0 * float(np.mean(ranks <= k)) for k in ks}
  metrics["MdR"] = median_rank(ranks, median_convention)
  metrics["MnR"] = float(np.mean(ranks))
  return metrics


def mean_average_precision(sim, relevance: Optional[np.ndarray] = None) -> float:
  """Mean average precision over queries, in percent (S-MiT tables 1-4).

    AP_q = 1 / R_q * sum_{j relevant} P@rank_q(j),   mAP = 100 / Q * sum_q AP_q

  where R_q is the number of relevant items of query q and P@r the fraction of
  relevant items among the top r. Ties are pessimistic: among equal scores,
  irrelevant items are ranked first. With one relevant item per query, as in
  S-MiT's paired test sets, AP_q = 1 / rank_q and mAP is the mean reciprocal
  rank.

  Args:
    sim: [Q, N] similarities.
    relevance: binary [Q, N] matrix (nonzero = relevant); None means the
      identity (item q is the only relevant item of query q).

  Returns:
    mAP in percent.
  """
  sim = _as_float_matrix(sim)
  if relevance is None:
    ranks = retrieval_ranks(sim)
    return 100.0 * float(np.mean(1.0 / ranks))
  relevance = np.asarray(relevance) != 0
  if relevance.shape != sim.shape:
    raise ValueError(f"relevance has shape {relevance.shape}, sim {sim.shape}")
  num_relevant = relevance.sum(axis=1)
  if (num_relevant == 0).any():
    raise ValueError(
        f"{int((num_relevant == 0).sum())} queries have no relevant item;"
        " their average precision is undefined")
  # Primary key: descending score; secondary: irrelevant (False) first.
  order = np.lexsort((relevance, -sim), axis=-1)
  hits = np.take_along_axis(relevance, order, axis=1)
  precision = np.cumsum(hits, axis=1) / np.arange(1, sim.shape[1] + 1)
  average_precision = (precision * hits).sum(axis=1) / num_relevant
  return 100.0 * float(np.mean(average_precision))


def subset_indices(n: int, *, n_subsets: int = 5, subset_size: int = 1000, seed: int = 0
                   ) -> list[np.ndarray]:
  """The pair indices of `subset_protocol`'s subsets (same draw for the same arguments)."""
  rng = np.random.default_rng(seed)
  return [rng.choice(n, size=subset_size, replace=False) for _ in range(n_subsets)]


def subset_protocol(sim, *, n_subsets: int = 5, subset_size: int = 1000,
                    seed: int = 0,
                    ks: Sequence[int] = (1, 5, 10)) -> Dict[str, float]:
  """S-MiT's evaluation: mean and std over random 1k-pair subsets.

  S-MiT sec. 5.1 / tables 1-4: "results are averaged over five random sets of
  1k video-caption pairs from the test set", reporting R@1, R@5, R@10 and mAP
  for caption->video, video->caption and their mean. Each subset is drawn
  independently (without replacement inside a subset) and both directions are
  scored on the same subset; "mean" is the per-subset average of the two
  directions, then averaged over subsets. Std is the population std (ddof=0)
  over subsets; the paper does not say which.

  Args:
    sim: [N, N] similarities of paired data, sim[i, j] = S(caption_i, video_j),
      so rows are caption->video queries.
    n_subsets: number of random subsets (S-MiT: 5).
    subset_size: pairs per subset (S-MiT: 1000).
    seed: seed of the subset draw.
    ks: cut-offs K for R@K.

  Returns:
    Flat dict: f"{direction}/{metric}" -> mean and f"{direction}/{metric}_std"
    -> std, direction in {"caption_to_video", "video_to_caption", "mean"},
    metric in {"R@K" for K in ks} | {"mAP"}; values in percent.
  """
  sim = _as_float_matrix(sim)
  if sim.shape[0] != sim.shape[1]:
    raise ValueError(f"subset_protocol needs paired data [N, N], got {sim.shape}")
  if not 1 <= subset_size <= sim.shape[0]:
    raise ValueError(f"subset_size must be in [1, {sim.shape[0]}], got {subset_size}")
  if n_subsets < 1:
    raise ValueError(f"n_subsets must be >= 1, got {n_subsets}")
  per_subset = {"caption_to_video": [], "video_to_caption": [], "mean": []}
  for idx in subset_indices(sim.shape[0], n_subsets=n_subsets, subset_size=subset_size,
                            seed=seed):
    sub = sim[np.ix_(idx, idx)]
    scores = {}
    for direction, matrix in (("caption_to_video", sub),
                              ("video_to_caption", sub.T)):
      recalls = retrieval_metrics(matrix, ks=ks)
      scores[direction] = np.array([recalls[f"R@{k}"] for k in ks]
                                   + [mean_average_precision(matrix)])
      per_subset[direction].append(scores[direction])
    per_subset["mean"].append(
        (scores["caption_to_video"] + scores["video_to_caption"]) / 2)
  names = [f"R@{k}" for k in ks] + ["mAP"]
  result = {}
  for direction, rows in per_subset.items():
    rows = np.stack(rows)
    for name, mean, std in zip(names, rows.mean(axis=0), rows.std(axis=0)):
      result[f"{direction}/{name}"] = float(mean)
      result[f"{direction}/{name}_std"] = float(std)
  return result


def in_batch_metrics(sim) -> dict:
  """Training scores of the global batch's `sim  # [B_text, B_video]`, positives on the
  diagonal (jnp, jit-able): batch_t2v_r1 (% of texts whose own video scores highest) and
  the mean positive_sim / negative_sim (diagonal / off-diagonal)."""
  hits = jnp.argmax(sim, axis=1) == jnp.arange(sim.shape[0])
  return {"batch_t2v_r1": 100.0 * jnp.mean(hits),
          "positive_sim": jnp.mean(jnp.diagonal(sim)),
          "negative_sim": (jnp.sum(sim) - jnp.trace(sim)) / (sim.size - sim.shape[0])}
