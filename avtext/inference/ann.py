"""Approximate candidate videos for VCMR: FAISS over a corpus store's clip vectors.

The VR score (TVR eq. 4) is a mean over streams of a max over clips of the
cosine, so a video ranks high only if some clip of some stream is close to the
query. `ClipIndex` keeps one FAISS inner-product index per stream over every
stored (normalized) H_0 clip vector; `candidates` returns, per query, the
videos owning each stream's `clips_per_stream` nearest clips. `vcmr.search(...,
candidates=...)` then scores exactly those videos with eq. 4 and ranks
moments with eq. 8 as the exhaustive path does; the recall against
exhaustive search is measured in benchmarks/speed/vcmr_corpus_search.py.

Index: IVF with `nlist` lists (k-means on a sample of `train_size` clips) and
clip codes `codes` (FAISS index-factory syntax: "SQ8", an 8-bit scalar quantizer
per dimension, or "PQ<bytes>", a product quantizer; inner product); `nprobe`
lists are searched per query. Padded clips (which repeat a
video's first clip in the store) are not indexed.
"""
import numpy as np

from avtext.inference import vcmr


class ClipIndex:
  """Per-stream FAISS indexes over a store's real clips (module docstring)."""

  def __init__(self, indexes, owners, num_videos: int):
    self.indexes, self.owners, self.num_videos = indexes, owners, num_videos

  @classmethod
  def build(cls, store: vcmr.CorpusStore, *, nlist: int = 1024, codes: str = "SQ8",
            train_size: int = 200_000, chunk: int = 8192, seed: int = 0) -> "ClipIndex":
    """One index per stream; `codes` is FAISS's code of each clip ("SQ8": 8 bits per
    dimension, D bytes a clip; "PQ32": 32 bytes a clip, for corpora whose SQ8 codes would
    not fit in memory beside the store)."""
    import faiss  # pylint: disable=g-import-not-at-top
    n, m, l, d = store.h["h0"].shape
    mask = np.asarray(store.mask).astype(bool)
    owners = np.repeat(np.arange(n, dtype=np.int64), l)[mask.reshape(-1)]
    rng = np.random.default_rng(seed)
    indexes = []
    for s in range(m):
      sample = np.sort(rng.choice(n, size=min(n, max(1, train_size // l)), replace=False))
      x = store.read("h0", sample)[:, s][mask[sample]]
      index = faiss.index_factory(d, f"IVF{min(nlist, len(x))},{codes}",
                                  faiss.METRIC_INNER_PRODUCT)
      index.train(np.ascontiguousarray(x, np.float32))
      for a in range(0, n, chunk):
        b = min(a + chunk, n)
        x = store.read("h0", slice(a, b))[:, s][mask[a:b]]
        index.add(np.ascontiguousarray(x, np.float32))
      indexes.append(index)
    return cls(indexes, owners, n)

  def candidates(self, q: np.ndarray, *, clips_per_stream: int = 4096, nprobe: int = 16
                 ) -> np.ndarray:
    """[Q, C] store rows (padded with -1): the owners of each stream's nearest clips."""
    q = vcmr.l2_normalize(np.asarray(q, np.float32))
    found = []
    for s, index in enumerate(self.indexes):
      index.nprobe = nprobe
      _, ids = index.search(np.ascontiguousarray(q[:, s]), clips_per_stream)
      found.append(np.where(ids >= 0, self.owners[np.maximum(ids, 0)], -1))
    rows = np.concatenate(found, axis=1)
    unique = [np.unique(r[r >= 0]) for r in rows]
    out = np.full((len(rows), max(1, max(len(u) for u in unique))), -1, np.int64)
    for i, u in enumerate(unique):
      out[i, :len(u)] = u
    return out
