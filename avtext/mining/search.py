"""Nearest frames of seed images within one shard of the corpus (FAISS), VideoCC §3.1 step 3.

`search_shard` takes the seeds' and one shard's frames' unit vectors and returns, for
every seed, its best matches in the shard: frames with similarity >= `tau`, ranked by
similarity, at most one per video by default (the best frame of each video; the
paper keeps "the top 10 matches" per seed and leaves open whether two may come from
one video; without this rule the top 10 of a seed are mostly neighbouring frames of
one scene, i.e. overlapping clips), `top_k` of them.

Index per shard: exact inner product (`IndexFlatIP`) while the shard has at most
`exact_max_frames` frames, else approximate: HNSW (`IndexHNSWFlat`, M=`hnsw_m`,
efSearch=`hnsw_ef_search`) or IVF (`IndexIVFFlat`, `ivf_nlist` lists, default
4 sqrt(N), `ivf_nprobe` probed). The index returns frame candidates; a seed's search
widens (k x 4) until it has `top_k` distinct videos at >= tau or has run below tau;
the kept videos' best frames and similarities are then recomputed in numpy, so an
exact index gives exactly the brute-force answer and an approximate one differs only in
which videos it finds. Shards hold whole videos, so merging shards' top-k lists
(`merge_top`) is exact.

Determinism. The similarity of a seed and a frame is defined as `similarity`: the dot
product of the float32 vectors summed in float64, then rounded to float32. Every
product of two float32 is exact in float64 and the float64 sum's rounding error is
~1e-16, so the float32 result does not depend on the summation order of the BLAS
kernel, its thread count or the CPU's vector width (ties that FAISS's own float32 sums
would break differently on another machine). FAISS only proposes candidates: a search
keeps widening until the candidates reach `MARGIN` below the top_k-th distinct video
(and below tau - `MARGIN`), far more than FAISS's float32 error on unit vectors
(<= D x 2^-24, 1.5e-5 at D = 256), so rounding in FAISS never drops a video from the
exact answer. Ranks break ties by (similarity desc, video, frame): a total order.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class IndexConfig:
  exact_max_frames: int = 200_000
  approx: str = 'hnsw'  # 'hnsw' | 'ivf'
  hnsw_m: int = 32
  hnsw_ef_search: int = 128
  ivf_nlist: int | None = None  # None: 4 sqrt(N)
  ivf_nprobe: int = 16

  def __post_init__(self):
    if self.approx not in ('hnsw', 'ivf'):
      raise ValueError(f"IndexConfig.approx must be 'hnsw' or 'ivf', got {self.approx!r}")


def build_index(x: np.ndarray, cfg: IndexConfig, *, force_exact: bool = False):
  """(faiss index over the rows of x, its description)."""
  import faiss  # pylint: disable=g-import-not-at-top
  x = np.ascontiguousarray(x, np.float32)
  n, d = x.shape
  if force_exact or n <= cfg.exact_max_frames:
    index, desc = faiss.IndexFlatIP(d), 'flat'
  elif cfg.approx == 'hnsw':
    index = faiss.IndexHNSWFlat(d, cfg.hnsw_m, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efSearch = cfg.hnsw_ef_search
    desc = f'hnsw{cfg.hnsw_m},ef{cfg.hnsw_ef_search}'
  else:
    nlist = cfg.ivf_nlist or max(1, int(4 * np.sqrt(n)))
    quantizer = faiss.IndexFlatIP(d)
    index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
    index.train(x)
    index.nprobe = cfg.ivf_nprobe
    desc = f'ivf{nlist},nprobe{cfg.ivf_nprobe}'
  index.add(x)
  return index, desc


MARGIN = 1e-4  # candidates reach this far below the k-th / tau (module docstring)


def similarity(frames: np.ndarray, q: np.ndarray) -> np.ndarray:
  """float32 dot products of rows of `frames` with `q`, summed in float64 (module
  docstring: the same bits on every machine and BLAS)."""
  return (np.asarray(frames, np.float64) @ np.asarray(q, np.float64)).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class Match:
  seed: int  # row of the seed matrix
  video: int  # video index within the shard
  frame: int  # frame row within the shard
  sim: float


def _best_frames(q: np.ndarray, frames: np.ndarray, video_start: np.ndarray,
                 video_stop: np.ndarray, videos: Sequence[int]) -> list[tuple[float, int, int]]:
  out = []
  for v in videos:
    a, b = int(video_start[v]), int(video_stop[v])
    s = similarity(frames[a:b], q)
    j = int(np.argmax(s))  # first maximum: the earliest frame on ties
    out.append((float(s[j]), int(v), a + j))
  return out


def search_shard(seeds: np.ndarray, frames: np.ndarray, frame_video: np.ndarray, *,
                 tau: float, top_k: int, one_per_video: bool = True,
                 index_cfg: IndexConfig = IndexConfig(), force_exact: bool = False,
                 index=None) -> tuple[list[list[Match]], dict]:
  """Per seed, its top_k matches in the shard (module docstring), and search info.

  frames: [N, D] unit vectors, grouped by video in time order; frame_video: int [N]
  the shard-local video of each frame (non-decreasing). Returns (matches per seed,
  {'index': desc, 'frames': N, 'seconds': search time}).
  """
  seeds = np.ascontiguousarray(seeds, np.float32)
  frames = np.ascontiguousarray(frames, np.float32)
  frame_video = np.asarray(frame_video, np.int64)
  n = len(frames)
  results: list[list[Match]] = [[] for _ in range(len(seeds))]
  if n == 0 or len(seeds) == 0 or top_k <= 0:
    return results, {'index': 'none', 'frames': n, 'seconds': 0.0}
  if np.any(np.diff(frame_video) < 0):
    raise ValueError('search_shard: frames must be grouped by video (frame_video sorted)')
  num_videos = int(frame_video.max()) + 1
  video_start = np.searchsorted(frame_video, np.arange(num_videos), side='left')
  video_stop = np.searchsorted(frame_video, np.arange(num_videos), side='right')
  t0 = time.perf_counter()
  if index is None:
    index, desc = build_index(frames, index_cfg, force_exact=force_exact)
  else:
    desc = 'given'
  k = min(n, top_k * 8 if one_per_video else top_k * 2)
  pending = np.arange(len(seeds))
  candidates: dict[int, list[int]] = {}
  while len(pending):
    sims, ids = index.search(seeds[pending], k)
    again = []
    for row, s, i in zip(pending, sims, ids):
      ok = (i >= 0) & (s >= tau - MARGIN)
      hit, hit_sims = i[ok], s[ok]
      if one_per_video:
        _, first = np.unique(frame_video[hit], return_index=True)
        unit_sims = hit_sims[np.sort(first)]  # each video's first (best) frame, rank order
        candidates[int(row)] = frame_video[hit][np.sort(first)].tolist()
      else:
        unit_sims = hit_sims
        candidates[int(row)] = hit.tolist()
      # Done when the candidates reach MARGIN below the top_k-th unit, or below tau, or
      # are everything: no unit FAISS ranked lower can be in the exact top_k.
      reached = len(unit_sims) >= top_k and s[-1] < unit_sims[top_k - 1] - MARGIN
      done = reached or not ok.all() or k >= n
      if not done:
        again.append(row)
    pending = np.asarray(again, np.int64)
    k = min(n, k * 4)
  for row, cand in candidates.items():
    q = seeds[row]
    if one_per_video:
      scored = _best_frames(q, frames, video_start, video_stop, cand)
    else:
      exact = similarity(frames[cand], q) if cand else []
      scored = [(float(x), int(frame_video[f]), int(f)) for x, f in zip(exact, cand)]
    scored = [t for t in scored if t[0] >= tau]
    scored.sort(key=lambda t: (-t[0], t[1], t[2]))
    results[row] = [Match(row, v, f, s) for s, v, f in scored[:top_k]]
  return results, {'index': desc, 'frames': n, 'seconds': time.perf_counter() - t0}


COSINE_BINS = 2000  # bins of width 0.001 over [-1, 1]


def cosine_histogram(seeds: np.ndarray, frames: np.ndarray) -> np.ndarray:
  """int64 [COSINE_BINS]: how many (seed, frame) pairs have their `similarity` in each
  bin [-1 + k / 1000, -1 + (k + 1) / 1000) (1.0 in the last). Integer counts: the
  histograms of shards add up to the same numbers in any order. The pipeline counts its
  `recall_sample` seeds against every frame: nearly all such pairs are unrelated (a
  seed matches a few scenes of a corpus), so the histogram is the embedder's cosine
  scale for unrelated pairs, where a threshold τ can be read off as a quantile."""
  counts = np.zeros(COSINE_BINS, np.int64)
  seeds = np.asarray(seeds, np.float32).astype(np.float64)
  for a in range(0, len(frames), 16384):  # float64 blocks of 16384 frames, not all at once
    s = (np.asarray(frames[a:a + 16384], np.float64) @ seeds.T).astype(np.float32)
    k = np.clip(np.floor((s.astype(np.float64) + 1.0) * (COSINE_BINS / 2)), 0,
                COSINE_BINS - 1).astype(np.int64)
    counts += np.bincount(k.ravel(), minlength=COSINE_BINS)
  return counts


def cosine_quantile(counts: Sequence[int], q: float) -> float:
  """The upper edge of the histogram bin where the cumulative count reaches q (0-1) of
  the pairs: the cosine below which a fraction >= q of them lie, to 0.001."""
  counts = np.asarray(counts, np.int64)
  if counts.sum() == 0:
    raise ValueError('cosine_quantile: an empty histogram')
  k = int(np.searchsorted(np.cumsum(counts), q * counts.sum()))
  return round(-1.0 + (min(k, len(counts) - 1) + 1) * 2.0 / len(counts), 6)


def merge_top(lists: Sequence[Sequence[tuple]], top_k: int) -> list[tuple]:
  """Merge per-shard match lists of (sim, video_id, time, ...) for one seed: the
  global top_k by similarity, ties by video id then time (deterministic)."""
  merged = [m for lst in lists for m in lst]
  merged.sort(key=lambda m: (-m[0], m[1], m[2]))
  return merged[:top_k]
