"""Video corpus moment retrieval with XML over a stored corpus (TVR sec. 4.3, eqs. 4, 7, 8).

The corpus is encoded once (`CorpusWriter`): per video, the Self-Encoder
outputs H^m_0 of every stream, L2-normalized per clip (for the VR cosine of
eq. 4), and the Cross-Encoder outputs H^m_1 (for ConvSE), on a fixed grid of
`max_len` clips with a mask. On disk, a directory:

  meta.json   {"videos": [vid_name], "video_idx": [int], "num_clips": [int],
               "streams": ["video", "sub"], "dim": D, "max_len": L,
               "dtype": "float32" | "bfloat16" | "int8", "clip_length": 1.5, ...}
  h0.bin, h1.bin   [V, M, L, D] in `dtype` (raw, C order; np.memmap); a padded clip of
                   h0 repeats the video's first clip, so the max of eq. 4 needs no mask;
                   padded clips of h1 are zero, or with `keep_padded_h1` the encoder's
                   values there (XML's official ConvSE reads them, model.masked_convse
                   False: the span logits over the store are then the model's own)
  h0_scale.bin, h1_scale.bin   float32 [V, M, L], int8 only: x = q * scale
  mask.bin    uint8 [V, L], 1 for real clips

Queries are answered (`search`) in two stages:
  1. VR: s_vr(v | q) = mean_m max_l <q_m / |q_m|, H^m_0[l]> over every video,
     streamed in chunks (`video_chunk`) through one GEMM per stream and block
     of `block` videos, keeping
     the best `top_n_videos` per query. Exhaustive; `candidates` restricts
     the scan to given videos (the FAISS path, `avtext.inference.ann`).
  2. VCMR (eq. 8) on those videos: ConvSE (`span_fn`, the model's
     `span_logits`) on their H_1, P_st / P_ed by masked softmax, spans under
     the length prior (`spans.vcmr_scores`: s_svmr * exp(alpha * s_vr)),
     the best `max_before_nms` kept; SVMR (eq. 7) on the query's own video
     when it is known.
Predictions are [video_idx, st, ed, score] in seconds, st = start * clip_length,
ed = (end + 1) * clip_length (end inclusive), in the TVR submission format
(`submission`); VR predictions are [video_idx, 0, 0, exp(alpha * s_vr)] as
the official code writes them.
"""
import dataclasses
import functools
import json
import pathlib
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from avtext import atomic
from avtext.data.builders import tvc
from avtext.inference import spans

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "int8": np.int8}
# Stored h0 bytes per dispatch of the exhaustive scan: large enough that dispatch and
# merge costs vanish, small enough that the host copy stays cheap (8192 videos of
# float32 were 335 MB and made the 10k scan 2.5x slower than chunks of 1024; 8, 16, 32
# and 64 MiB measured 0.37, 0.31, 0.24 and 0.40 s on the 10k float32 store).
CHUNK_BYTES = 32 << 20


def l2_normalize(x: np.ndarray, axis: int = -1) -> np.ndarray:
  norm = np.linalg.norm(x, axis=axis, keepdims=True)
  return x / np.maximum(norm, 1e-12)


def quantize_int8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Symmetric per-vector int8: (q int8 [..., D], scale float32 [...]) with x ~ q * scale."""
  scale = np.max(np.abs(x), axis=-1) / 127.0
  safe = np.where(scale > 0, scale, 1.0)
  q = np.clip(np.rint(x / safe[..., None]), -127, 127).astype(np.int8)
  return q, scale.astype(np.float32)


class CorpusWriter:
  """Writes a corpus store chunk by chunk (memory stays one chunk); `close` writes meta.json."""

  def __init__(self, directory, *, num_videos: int, streams: Sequence[str], dim: int,
               max_len: int, dtype: str = "float32", clip_length: float = tvc.CLIP_LENGTH,
               keep_padded_h1: bool = False, encoded_by: dict | None = None):
    if dtype not in DTYPES:
      raise ValueError(f"corpus dtype {dtype!r}; expected one of {sorted(DTYPES)}")
    self.dir = pathlib.Path(directory)
    self.keep_padded_h1 = bool(keep_padded_h1)
    self.dir.mkdir(parents=True, exist_ok=True)
    (self.dir / "meta.json").unlink(missing_ok=True)  # incomplete until close()
    self.meta = dict(streams=list(streams), dim=int(dim), max_len=int(max_len), dtype=dtype,
                     clip_length=float(clip_length), num_videos=int(num_videos))
    if encoded_by:  # what the encodings depend on: {"workdir": ..., "step": N}
      self.meta["encoded_by"] = dict(encoded_by)
    shape = (num_videos, len(streams), max_len, dim)
    self.h = {n: np.memmap(self.dir / f"{n}.bin", DTYPES[dtype], "w+", shape=shape)
              for n in ("h0", "h1")}
    self.scale = ({n: np.memmap(self.dir / f"{n}_scale.bin", np.float32, "w+", shape=shape[:3])
                   for n in ("h0", "h1")} if dtype == "int8" else None)
    self.mask = np.memmap(self.dir / "mask.bin", np.uint8, "w+", shape=(num_videos, max_len))
    self.videos, self.video_idx, self.num_clips = [], [], []

  def add(self, names: Sequence[str], video_idx: Sequence[int], h0: np.ndarray, h1: np.ndarray,
          mask: np.ndarray) -> None:
    """Appends videos: h0, h1 float [n, M, L, D] (h0 is normalized here), mask [n, L]."""
    start, n = len(self.videos), len(names)
    if start + n > self.mask.shape[0]:
      raise ValueError(f"corpus store {self.dir}: more than the {self.mask.shape[0]} videos "
                       "announced")
    want = self.h["h0"].shape[1:]
    if h0.shape[1:] != want or h1.shape[1:] != want or mask.shape != (n, want[1]):
      raise ValueError(f"corpus store {self.dir}: expected h0, h1 [n, {want}] and mask "
                       f"[n, {want[1]}], got {h0.shape}, {h1.shape}, {mask.shape}")
    mask = np.asarray(mask).astype(bool)
    if not mask[:, 0].all():
      raise ValueError(f"corpus store {self.dir}: every video needs a first real clip")
    h0 = l2_normalize(np.asarray(h0, np.float32))
    h0 = np.where(mask[:, None, :, None], h0, h0[:, :, :1])  # padding = clip 0 (max unchanged)
    h1 = np.asarray(h1, np.float32)
    if not self.keep_padded_h1:
      h1 = h1 * mask[:, None, :, None]
    for name, x in (("h0", h0), ("h1", h1)):
      if self.scale is not None:
        x, s = quantize_int8(x)
        self.scale[name][start:start + n] = s
      self.h[name][start:start + n] = x
    self.mask[start:start + n] = mask
    self.videos += list(names)
    self.video_idx += [int(i) for i in video_idx]
    self.num_clips += [int(c) for c in mask.sum(axis=1)]

  def close(self) -> "CorpusStore":
    if len(self.videos) != self.mask.shape[0]:
      raise ValueError(f"corpus store {self.dir}: {len(self.videos)} videos written, "
                       f"{self.mask.shape[0]} announced")
    for x in [*self.h.values(), self.mask, *(self.scale or {}).values()]:
      x.flush()
    meta = {**self.meta, "videos": self.videos, "video_idx": self.video_idx,
            "num_clips": self.num_clips}
    # meta.json marks the store complete: written whole or not at all (a reader never
    # sees half of it after a crash).
    atomic.write_json(self.dir / "meta.json", meta)
    return CorpusStore(self.dir)


class CorpusStore:
  """A stored corpus, memory-mapped (module docstring)."""

  def __init__(self, directory):
    self.dir = pathlib.Path(directory)
    meta_file = self.dir / "meta.json"
    if not meta_file.is_file():
      raise FileNotFoundError(f"{meta_file} not found: not a finished corpus store (encode "
                              "one with `--mode=eval` of a moments config or CorpusWriter)")
    self.meta = json.loads(meta_file.read_text())
    self.videos = self.meta["videos"]
    self.video_idx = np.asarray(self.meta["video_idx"], np.int64)
    self.streams, self.dim = tuple(self.meta["streams"]), int(self.meta["dim"])
    self.max_len, self.dtype = int(self.meta["max_len"]), self.meta["dtype"]
    self.clip_length = float(self.meta["clip_length"])
    shape = (len(self.videos), len(self.streams), self.max_len, self.dim)
    for name in ("h0", "h1", "mask"):
      if not (self.dir / f"{name}.bin").is_file():
        raise FileNotFoundError(f"{self.dir / (name + '.bin')} not found (corpus store)")
    self.h = {n: np.memmap(self.dir / f"{n}.bin", DTYPES[self.dtype], "r", shape=shape)
              for n in ("h0", "h1")}
    self.scale = ({n: np.memmap(self.dir / f"{n}_scale.bin", np.float32, "r", shape=shape[:3])
                   for n in ("h0", "h1")} if self.dtype == "int8" else None)
    self.mask = np.memmap(self.dir / "mask.bin", np.uint8, "r", shape=(shape[0], shape[2]))

  def __len__(self) -> int:
    return len(self.videos)

  @property
  def encoded_by(self) -> dict:
    """{"workdir", "step"} of the weights that encoded it, as far as known: meta.json's
    (stores written since it was kept), else the step in an evaluator's directory name
    (`<eval>_step<N>`); {} when neither says."""
    import re  # pylint: disable=g-import-not-at-top
    if self.meta.get("encoded_by"):
      return dict(self.meta["encoded_by"])
    found = re.search(r"_step(\d+)$", self.dir.name)
    return {"step": int(found.group(1))} if found else {}

  @property
  def nbytes_h0(self) -> int:
    return self.h["h0"].nbytes + (self.scale["h0"].nbytes if self.scale else 0)

  def read(self, name: str, index) -> np.ndarray:
    """float32 rows `index` (a slice or an int array) of h0 / h1, dequantized."""
    x = np.asarray(self.h[name][index]).astype(np.float32)
    if self.scale is not None:
      x *= np.asarray(self.scale[name][index])[..., None]
    return x


def _merge_topk(scores: np.ndarray, index: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
  """Best k columns per row of (scores, index), sorted by decreasing score (ties: lower index)."""
  if scores.shape[1] > k:
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    scores = np.take_along_axis(scores, part, 1)
    index = np.take_along_axis(index, part, 1)
  order = np.lexsort((index, -scores), axis=1)
  return np.take_along_axis(scores, order, 1), np.take_along_axis(index, order, 1)


def _block_scores(q_norm, h0, scale, compute_dtype):
  """s_vr [Q, C] of a block h0 [C, M, L, D]: per stream one GEMM [C*L, D] x [D, Q] with
  operands in `compute_dtype` and a float32 result, then the per-clip scale and the max
  over clips."""
  c, m, l, d = h0.shape
  total = jnp.zeros((c, q_norm.shape[0]), jnp.float32)
  for s in range(m):
    x = h0[:, s].reshape(c * l, d).astype(compute_dtype)
    sim = jax.lax.dot_general(x, q_norm[:, s].astype(compute_dtype), (((1,), (1,)), ((), ())),
                              preferred_element_type=jnp.float32).reshape(c, l, -1)
    if scale is not None:
      sim = sim * scale[:, s, :, None]
    total = total + sim.max(axis=1)
  return (total / m).T


@functools.partial(jax.jit, static_argnames=("block", "compute_dtype"))
def _scan_chunk(q_norm: jax.Array, h0: jax.Array, scale: jax.Array | None, *,
                block: int = 128, compute_dtype: str = "float32") -> jax.Array:
  """s_vr [Q, C] of a chunk of C videos, `block` videos at a time (C % block == 0 when
  C > block): each block's converted operand and GEMM output stay in cache, where one
  chunk-wide GEMM would stream them through memory (several times the stored bytes)."""
  c = h0.shape[0]
  if c <= block:
    return _block_scores(q_norm, h0, scale, compute_dtype)
  if c % block:
    raise ValueError(f"_scan_chunk: {c} videos is not a multiple of block={block}")
  blocks = (h0.reshape(c // block, block, *h0.shape[1:]),
            None if scale is None else scale.reshape(c // block, block, *scale.shape[1:]))
  _, out = jax.lax.scan(
      lambda _, xs: (None, _block_scores(q_norm, *xs, compute_dtype)), None, blocks)
  return out.transpose(1, 0, 2).reshape(q_norm.shape[0], c)


@functools.partial(jax.jit, static_argnames=("k", "block", "compute_dtype"))
def _scan_chunk_top_k(q_norm, h0, scale, valid, *, k: int, block: int, compute_dtype: str):
  """The k best (s_vr, column) per query of a chunk whose first `valid` videos are real."""
  s = _scan_chunk(q_norm, h0, scale, block=block, compute_dtype=compute_dtype)
  s = jnp.where(jnp.arange(s.shape[1])[None] < valid, s, -jnp.inf)
  return jax.lax.top_k(s, k)


def chunk_video_scores(q_norm: np.ndarray, h0: np.ndarray, scale: np.ndarray | None = None,
                       *, block: int = 128, compute_dtype: str = "float32") -> np.ndarray:
  """s_vr [Q, C] of normalized queries [Q, M, D] on a stored chunk h0 [C, M, L, D] (any
  dtype; padded clips repeat clip 0, so the max over all L clips is the max over the real
  ones). Compiled once per chunk shape and dtype."""
  return np.asarray(_scan_chunk(jnp.asarray(q_norm, jnp.float32), np.asarray(h0),
                                None if scale is None else np.asarray(scale), block=block,
                                compute_dtype=compute_dtype))


def video_retrieval(store: CorpusStore, q: np.ndarray, k: int, *,
                    video_chunk: int | None = None,
                    block: int = 128, compute_dtype: str = "float32",
                    candidates: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
  """(s_vr [Q, k], store row [Q, k]) of the k best videos per query, eq. 4.

  Exhaustive over the store in chunks of `video_chunk` videos (default: CHUNK_BYTES of
  stored h0; one dispatch each, the next chunk's dispatch overlapping this one's
  merge), each scanned `block` videos at a time, or, with `candidates` [Q, C] store
  rows (-1 = none), over each query's candidates only (exact float32 scores on the
  host; `compute_dtype` does not apply).
  `compute_dtype` is the GEMM operand type (float32 result): "float32" scores the stored
  values exactly; "bfloat16" is exact on int8 stores (|x| <= 127 has 8 significant bits)
  and bfloat16 stores and rounds only the query (relative 2^-9, finer than int8's step),
  for up to 2x the GEMM rate where the CPU has bf16 instructions (AVX512-BF16, AMX) or on
  accelerators.
  """
  if compute_dtype not in ("float32", "bfloat16"):
    raise ValueError(f"video_retrieval: compute_dtype must be float32 or bfloat16, got "
                     f"{compute_dtype!r}")
  q_norm = l2_normalize(np.asarray(q, np.float32))
  n = len(store)
  k = min(k, n)
  if candidates is not None:
    return _candidate_retrieval(store, q_norm, np.asarray(candidates), k)
  best_s = np.full((q_norm.shape[0], 0), -np.inf, np.float32)
  best_i = np.zeros((q_norm.shape[0], 0), np.int64)
  q_dev = jnp.asarray(q_norm)
  if video_chunk is None:
    video_chunk = CHUNK_BYTES // store.h["h0"][0].nbytes
  chunk = max(1, min(video_chunk, n))
  if chunk > block:  # whole blocks
    chunk = chunk // block * block
  pending = None
  for a in range(0, n, chunk):
    b = min(a + chunk, n)
    # The tail is padded to whole blocks by repeating the last video (one more shape).
    width = b - a if b - a == chunk or b - a <= block else -(-(b - a) // block) * block
    rows = slice(a, b) if width == b - a else np.minimum(np.arange(a, a + width), n - 1)
    # Dispatched before the previous chunk's result is merged: the host merge and the
    # next chunk's copy overlap the GEMM.
    result = (a, _scan_chunk_top_k(
        q_dev, np.asarray(store.h["h0"][rows]),
        None if store.scale is None else np.asarray(store.scale["h0"][rows]), b - a,
        k=min(k, width), block=block, compute_dtype=compute_dtype))
    if pending is not None:
      best_s, best_i = _merge_chunk(best_s, best_i, pending, k)
    pending = result
  return _merge_chunk(best_s, best_i, pending, k)


def _candidate_retrieval(store: CorpusStore, q_norm: np.ndarray, candidates: np.ndarray,
                         k: int) -> tuple[np.ndarray, np.ndarray]:
  """`video_retrieval` over each query's candidate rows (deduplicated), on the host: a
  query's candidates are a few hundred to thousands of videos, scored by one float32
  GEMM [C*M*L, D] x [D, M] (its stream diagonal kept) in buffers reused across queries;
  memory-bound, where a jitted call per query pays an input copy into fresh pages."""
  if candidates.ndim != 2 or candidates.shape[0] != q_norm.shape[0]:
    raise ValueError(f"video_retrieval: candidates must be [Q={q_norm.shape[0]}, C] store "
                     f"rows, got shape {candidates.shape}")
  unique = [np.unique(c[(c >= 0) & (c < len(store))]) for c in candidates]
  width = max(1, max(len(u) for u in unique))
  h0 = store.h["h0"]
  _, m, l, d = h0.shape
  raw = np.empty((width, m, l, d), h0.dtype)
  x = raw if h0.dtype == np.float32 else np.empty((width, m, l, d), np.float32)
  streams = np.arange(m)
  out_s = np.full((len(unique), k), -np.inf, np.float32)
  out_i = np.full((len(unique), k), -1, np.int64)
  for i, rows in enumerate(unique):
    c = len(rows)
    if not c:
      continue
    np.take(h0, rows, axis=0, out=raw[:c], mode="clip")  # rows are valid; no temporary
    if x is not raw:
      np.copyto(x[:c], raw[:c], casting="unsafe")
    sim = (x[:c].reshape(c * m * l, d) @ q_norm[i].T).reshape(c, m, l, m)
    sim = sim[:, streams, :, streams]  # [M, C, L]: stream m's clips against q_m
    if store.scale is not None:
      sim = sim * np.asarray(store.scale["h0"][rows]).transpose(1, 0, 2)
    score, row = _merge_topk(sim.max(axis=-1).mean(axis=0)[None], rows[None], min(k, c))
    out_s[i, :score.shape[1]], out_i[i, :score.shape[1]] = score[0], row[0]
  return out_s, out_i


def _merge_chunk(best_s, best_i, pending, k: int):
  start, (s, i) = pending
  s, i = np.asarray(s), np.asarray(i).astype(np.int64) + start
  return _merge_topk(np.concatenate([best_s, s], 1), np.concatenate([best_i, i], 1), k)


def masked_softmax(logits: jax.Array, mask: jax.Array) -> jax.Array:
  return jax.nn.softmax(jnp.where(mask.astype(bool), logits, -jnp.inf), axis=-1)


@dataclasses.dataclass(frozen=True)
class SearchConfig:
  """XML's inference settings (official defaults)."""
  top_n_videos: int = 100  # max_vcmr_video
  alpha: float = 20.0  # q2c_alpha
  min_len: int = 2  # length prior, clips (see avtext/inference/spans.py)
  max_len: int = 16
  max_before_nms: int = 200
  query_batch: int = 8  # queries whose candidates are scored together (memory)
  video_chunk: int | None = None  # videos per dispatch of the VR scan (None: CHUNK_BYTES)
  block: int = 128  # videos per GEMM inside a chunk (operands stay in cache)
  compute_dtype: str = "float32"  # VR GEMM operands; see `video_retrieval`


def _probs(span_fn, params, q, h1, mask):
  """(P_st, P_ed) [Q, N, L] of queries [Q, M, D] on their candidates h1 [Q, N, M, L, D];
  for a sliding-window head (P_clip = sigmoid of the clip logits, 0 at padding; None)."""
  out = span_fn(params, q[:, None], h1, mask)
  if "clip" in out:
    return jnp.where(mask.astype(bool), jax.nn.sigmoid(out["clip"]), 0.0), None
  return masked_softmax(out["start"], mask), masked_softmax(out["end"], mask)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _vcmr_stage(span_fn, cfg: SearchConfig, k: int, params, q, h1, mask, video_score):
  p_st, p_ed = _probs(span_fn, params, q, h1, mask)
  return spans.vcmr_scores(video_score, p_st, p_ed, top_n_videos=video_score.shape[1],
                           alpha=cfg.alpha, min_len=cfg.min_len, max_len=cfg.max_len, k=k)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _svmr_stage(span_fn, cfg: SearchConfig, k: int, params, q, h1, mask):
  p_st, p_ed = _probs(span_fn, params, q, h1[:, None], mask[:, None])
  if p_ed is None:
    return spans.top_windows(p_st[:, 0], min_len=cfg.min_len, max_len=cfg.max_len, k=k)
  return spans.top_spans(p_st[:, 0], p_ed[:, 0], min_len=cfg.min_len, max_len=cfg.max_len,
                         k=k)


def _batches(num: int, size: int):
  """(start, stop, row indices padded to `size` by repeating the last): fixed shapes."""
  for a in range(0, num, size):
    b = min(a + size, num)
    yield a, b, np.minimum(np.arange(a, a + size), b - 1)


def search(store: CorpusStore, q: np.ndarray, span_fn: Callable, cfg: SearchConfig, *,
           params: Any = None, own_video: Sequence[int | None] | None = None,
           candidates: np.ndarray | None = None) -> dict[str, list]:
  """VR, VCMR and (where `own_video` gives a query's store row) SVMR predictions.

  Args:
    store: the encoded corpus.
    q: float32 [Q, M, D] modular query vectors (the model's `encode_query`).
    span_fn: `(params, q [Q, 1, M, D], h1 [Q, N, M, L, D], mask [Q, N, L]) ->
      {"start", "end"} logits [Q, N, L]` (the model's `span_logits`; {"clip"} for the
      sliding-window baseline, spans scored by their mean sigmoid); traced inside one
      jitted ranking stage per batch shape, so pass the same function object each
      call (weights go in `params`, not in a closure).
    cfg: `SearchConfig`.
    params: what `span_fn` takes first (the model variables).
    own_video: per query, the store row of its ground-truth video, or None.
    candidates: optional [Q, C] store rows to restrict VR to (-1 = none).

  Returns:
    {"VR": [Q lists of [row, score]], "VCMR": [Q lists of [row, start, end, score]],
     "SVMR": [Q lists or None]}; start / end are clip indices (end inclusive).
  """
  q = np.asarray(q, np.float32)
  num_q, n = q.shape[0], min(cfg.top_n_videos, len(store))
  vr_s, vr_i = video_retrieval(store, q, n, video_chunk=cfg.video_chunk, block=cfg.block,
                               compute_dtype=cfg.compute_dtype, candidates=candidates)
  out = {"VR": [], "VCMR": [], "SVMR": []}
  for i in range(num_q):
    keep = vr_i[i] >= 0
    out["VR"].append([[int(r), float(s)] for r, s in zip(vr_i[i][keep], vr_s[i][keep])])
  num_spans = spans._check_lengths(cfg.min_len, cfg.max_len, store.max_len, "search")  # pylint: disable=protected-access
  batch = min(cfg.query_batch, num_q)
  for a, b, idx in _batches(num_q, batch):
    rows = vr_i[idx]
    valid = rows >= 0
    safe = np.where(valid, rows, 0)
    h1 = store.read("h1", safe.reshape(-1)).reshape(*rows.shape, *store.h["h1"].shape[1:])
    mask = np.asarray(store.mask[safe.reshape(-1)]).reshape(*rows.shape, -1) * valid[..., None]
    video_score = np.where(valid, vr_s[idx], -1e4)  # a missing candidate: exp(-alpha 1e4) = 0
    vid, st, ed, score = jax.device_get(_vcmr_stage(
        span_fn, cfg, min(cfg.max_before_nms, n * num_spans), params, q[idx], h1, mask,
        video_score))
    vid = np.take_along_axis(rows, vid, 1)
    for j in range(b - a):
      out["VCMR"].append([[int(v), int(s), int(e), float(c)] for v, s, e, c
                          in zip(vid[j], st[j], ed[j], score[j]) if v >= 0])
  own = list(own_video) if own_video is not None else [None] * num_q
  known = [i for i in range(num_q) if own[i] is not None]
  svmr = {}
  for a, b, idx in _batches(len(known), min(cfg.query_batch, max(len(known), 1))):
    queries = np.asarray(known)[idx]
    rows = np.asarray([own[i] for i in queries])
    st, ed, score = jax.device_get(_svmr_stage(
        span_fn, cfg, min(cfg.max_before_nms, num_spans), params, q[queries],
        store.read("h1", rows),
        np.asarray(store.mask[rows])))
    for j in range(b - a):
      svmr[int(queries[j])] = [[int(rows[j]), int(s), int(e), float(c)]
                               for s, e, c in zip(st[j], ed[j], score[j])]
  out["SVMR"] = [svmr.get(i) for i in range(num_q)]
  return out


def submission(store: CorpusStore, results: dict[str, list], queries: Sequence[dict], *,
               alpha: float, top_n: int = 100) -> dict[str, Any]:
  """The TVR submission dict (official format) of `search` results for `queries`
  (dicts with desc_id and desc): seconds, video ids from the store's video_idx."""
  cl = store.clip_length
  vidx = store.video_idx
  sub = {"video2idx": {v: int(i) for v, i in zip(store.videos, vidx)}, "VCMR": [], "VR": []}
  has_svmr = any(r is not None for r in results["SVMR"])
  if has_svmr:
    sub["SVMR"] = []
  for i, query in enumerate(queries):
    head = {"desc_id": query["desc_id"], "desc": query.get("desc", "")}
    sub["VR"].append({**head, "predictions": [
        [int(vidx[r]), 0, 0, float(np.exp(alpha * s))] for r, s in results["VR"][i][:top_n]]})
    sub["VCMR"].append({**head, "predictions": [
        [int(vidx[r]), float(s * cl), float((e + 1) * cl), c]
        for r, s, e, c in results["VCMR"][i][:top_n]]})
    if has_svmr:
      preds = results["SVMR"][i] or []
      sub["SVMR"].append({**head, "predictions": [
          [int(vidx[r]), float(s * cl), float((e + 1) * cl), c] for r, s, e, c in preds[:top_n]]})
  return sub
