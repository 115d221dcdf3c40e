r"""Corpus-scale VCMR: 100 queries over N stored videos of 20 clips (TVR Table 8's setting).

    python -m benchmarks.speed.vcmr_corpus_search [--out=DIR] \
        --sizes=10000,100000,1000000 [--queries=100] [--faiss] [--compute_dtypes=float32,bfloat16]

For each N a corpus store (`avtext.inference.vcmr`) of synthetic XML encodings
(2 streams x 20 clips x 256-d, the official hidden size) is written once, in
float32 where it fits in memory and in int8 (per-vector scales) for 1M videos
(float32 would be 82 GB, bfloat16 41 GB); 100 queries are answered with
`vcmr.search` (exhaustive VR over every clip, then eq. 8 with ConvSE of a
randomly initialized official-size XML on the top 100 videos, 200 moments kept).
Each timing runs in a fresh subprocess, which reports its peak RSS (file-mapped
store pages included).

Encodings: the videos fall in topics of 200 (N / 200 topics, random unit vectors
per stream); a clip is its topic's vector plus noise, normalized, so a query (a
topic vector plus noise) has a top 100 set apart from the rest of the corpus, as a
real query's relevant videos are, and the order inside it is decided by the noise. Recall of reduced-precision stores is measured
against float32 on the 10k corpus (same encodings): the share of the float32 VR
top 100 that they return, and of the float32 VCMR top 10 moments in their top 100.

Roofline of exhaustive search (measured in the same run): the larger of
  - reading the stored h0 once at the machine's read bandwidth (a float32 array
    in memory summed, best of 3; the store sits in the page cache after a warm-up
    pass, which the timed passes are not charged for), and
  - the 2 Q N M L D multiply-adds of eq. 4 at the measured single-precision GEMM
    peak (a 4096^3 matmul, best of 3).

`--compute_dtypes=float32,bfloat16`: also time the exhaustive path with bfloat16 GEMM
operands on the reduced-precision stores (exact on int8 and bfloat16 values; only the
query rounds), against the same float32 roofline; recall is against the first row of
the same N (the float32 store at 10k).

`--faiss`: the approximate path; one FAISS inner-product index per stream over every
clip vector (IVF, 1,024 lists, 8-bit scalar quantizer, or 32-byte product quantizer
codes where SQ8's would not fit beside the store; `nprobe` lists probed), the
videos of each stream's top `--faiss_clips` clips as candidates, then the exact VR
score of those candidates and eq. 8 as above. Reported: VR top-100 recall against
exhaustive, time per 100 queries (index build reported apart). The stores are written
under --out (20 GB for 1M videos). --quick: a 2000-video corpus, 10 queries. Rows: one per
(N, storage, GEMM, path) with its time, roofline, peak RSS and recall.
"""
import json
import pathlib
import resource
import subprocess
import sys
import time

from absl import flags
import numpy as np

from avtext.inference import vcmr
from benchmarks import common

_SIZES = flags.DEFINE_list("sizes", ["10000", "100000", "1000000"], "corpus sizes N")
_QUERIES = flags.DEFINE_integer("queries", 100, "queries")
_CLIPS = flags.DEFINE_integer("clips", 20, "clips a video")
_DIM = flags.DEFINE_integer("dim", 256, "encoding width")
_FP32_MAX = flags.DEFINE_float("fp32_max_bytes", 12e9, "stores whose float32 h0 + h1 exceed "
                               "this are written in int8")
_FAISS = flags.DEFINE_bool("faiss", False, "also time the approximate path")
_NLIST = flags.DEFINE_integer("nlist", 1024, "IVF lists")
_NPROBE = flags.DEFINE_integer("nprobe", 16, "IVF lists probed")
_FAISS_CLIPS = flags.DEFINE_integer("faiss_clips", 4096, "candidate clips a stream")
_FAISS_CODES = flags.DEFINE_string("faiss_codes", "auto", "FAISS clip codes; auto: SQ8 (D bytes "
                                   "a clip) where the codes and the stored h0 fit in "
                                   "--fp32_max_bytes, else PQ32 (32 bytes a clip)")
_COMPUTE_DTYPES = flags.DEFINE_list("compute_dtypes", ["float32"], "VR GEMM operand types to "
                                    "time the exhaustive path with (bfloat16 only on "
                                    "reduced-precision stores, where it is exact)")
_COMPUTE_DTYPE = flags.DEFINE_string("compute_dtype", "float32", "(worker)")
_WORKER = flags.DEFINE_bool("worker", False, "(worker process)")
_STORE = flags.DEFINE_string("store", None, "(worker) the corpus store")
SYSTEM = "TVR: XML"

VIDEOS_PER_TOPIC = 200
STREAMS = ("video", "sub")


def machine_roofline() -> dict:
  """Read bandwidth (GB/s) and GEMM peak (GFLOP/s) of this machine, best of 3."""
  x = np.ones(2**29, np.float32)  # 2 GiB
  x.sum()
  reads = []
  for _ in range(3):
    t = time.perf_counter()
    x.sum()
    reads.append(x.nbytes / (time.perf_counter() - t) / 1e9)
  del x
  a = np.random.default_rng(0).random((4096, 4096), dtype=np.float32)
  a @ a
  gemms = []
  for _ in range(3):
    t = time.perf_counter()
    a @ a
    gemms.append(2 * 4096**3 / (time.perf_counter() - t) / 1e9)
  return {"read_GBps": max(reads), "gemm_GFLOPs": max(gemms)}


def topic_vectors(n: int, dim: int, seed: int = 0) -> np.ndarray:
  topics = max(1, n // VIDEOS_PER_TOPIC)
  t = np.random.default_rng(seed).standard_normal((topics, len(STREAMS), dim), np.float32)
  return t / np.linalg.norm(t, axis=-1, keepdims=True)


def build(directory: pathlib.Path, n: int, dtype: str, *, clips: int, dim: int,
          chunk: int = 8192, seed: int = 0) -> vcmr.CorpusStore:
  """A store of n synthetic videos (module docstring); reused when complete."""
  if (directory / "meta.json").is_file():
    return vcmr.CorpusStore(directory)
  topics = topic_vectors(n, dim)
  rng = np.random.default_rng(seed)
  # H_1 is only read for each query's top videos, so its values do not change any timing:
  # one random block, reused, keeps writing 1M videos in minutes.
  h1 = rng.standard_normal((chunk, len(STREAMS), clips, dim), np.float32)
  writer = vcmr.CorpusWriter(directory, num_videos=n, streams=STREAMS, dim=dim,
                             max_len=clips, dtype=dtype)
  for a in range(0, n, chunk):
    b = min(a + chunk, n)
    topic = (np.arange(a, b) * 7919) % len(topics)  # deterministic per video
    noise = rng.standard_normal((b - a, len(STREAMS), clips, dim), np.float32)
    h0 = topics[topic][:, :, None] + noise * (1.5 / np.sqrt(dim))
    writer.add([f"video{i}" for i in range(a, b)], range(a, b), h0, h1[:b - a],
               np.ones((b - a, clips), np.int32))
    print(f"\r  writing {directory.name}: {b}/{n}", end="", file=sys.stderr, flush=True)
  print(file=sys.stderr)
  return writer.close()


def queries(num: int, n: int, dim: int, seed: int = 1) -> np.ndarray:
  rng = np.random.default_rng(seed)
  topics = topic_vectors(n, dim)
  q = topics[rng.integers(0, len(topics), num)] + rng.standard_normal(
      (num, len(STREAMS), dim), np.float32) * (1.0 / np.sqrt(dim))
  return q.astype(np.float32)


def span_fn(dim: int, clips: int):
  """Jitted ConvSE stage of an official-size XML with random weights."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from avtext.models import xml  # pylint: disable=g-import-not-at-top
  model = xml.XML(hidden_size=dim, max_ctx_len=clips)
  x = {"video": jnp.zeros((1, clips, 8)), "sub": jnp.zeros((1, clips, 8))}
  variables = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 4, 8)), jnp.ones((1, 4)), x,
                         jnp.ones((1, clips)))
  return (lambda v, q, h1, m: model.apply(v, q, h1, m, method=model.span_logits)), variables


def worker(args) -> dict:
  """`args`: the flags (this process is a worker)."""
  """One timing in this process: {'seconds', 'vr_seconds', 'peak_rss_GB', results...}."""
  store = vcmr.CorpusStore(args.store)
  q = queries(args.queries, len(store), store.dim)
  fn, variables = span_fn(store.dim, store.max_len)
  cfg = vcmr.SearchConfig(compute_dtype=args.compute_dtype)
  candidates, build_s = None, 0.0
  if args.faiss:
    from avtext.inference import ann  # pylint: disable=g-import-not-at-top
    t = time.perf_counter()
    index = ann.ClipIndex.build(store, nlist=args.nlist, codes=args.faiss_codes)
    build_s = time.perf_counter() - t
  vcmr.search(store, q, fn, cfg, params=variables)  # warm-up: compile, and the store into the page cache
  vcmr.video_retrieval(store, q, cfg.top_n_videos, compute_dtype=cfg.compute_dtype)
  t = time.perf_counter()
  if args.faiss:
    candidates = index.candidates(q, clips_per_stream=args.faiss_clips, nprobe=args.nprobe)
  vr_s, vr_i = vcmr.video_retrieval(store, q, cfg.top_n_videos, candidates=candidates,
                                    compute_dtype=cfg.compute_dtype)
  vr_time = time.perf_counter() - t
  t = time.perf_counter()
  if args.faiss:
    candidates = index.candidates(q, clips_per_stream=args.faiss_clips, nprobe=args.nprobe)
  out = vcmr.search(store, q, fn, cfg, params=variables, candidates=candidates)
  seconds = time.perf_counter() - t
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
  return {"seconds": seconds, "vr_seconds": vr_time, "peak_rss_GB": peak,
          "index_build_seconds": build_s, "vr": [[r for r, _ in x] for x in out["VR"]],
          "vcmr": [[m[:3] for m in x[:100]] for x in out["VCMR"]]}


def run_worker(store, queries: int, faiss: bool = False, compute_dtype: str = "float32",
               codes: str = "SQ8") -> dict:
  cmd = common.child("--worker", f"--store={store}", f"--queries={queries}",
                     f"--nlist={_NLIST.value}", f"--nprobe={_NPROBE.value}",
                     f"--faiss_clips={_FAISS_CLIPS.value}", f"--compute_dtype={compute_dtype}",
                     f"--faiss_codes={codes}", f"--faiss={faiss}")
  out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=common.REPO)
  return json.loads(out.stdout.strip().splitlines()[-1])


def recall(got: list[list], ref: list[list], k_ref: int) -> float:
  return float(np.mean([len({tuple(x) if isinstance(x, list) else x for x in g}
                            & {tuple(x) if isinstance(x, list) else x for x in r[:k_ref]})
                        / min(k_ref, len(r)) for g, r in zip(got, ref)]))


def main(argv):
  del argv
  flag = flags.FLAGS
  if flag.worker:
    print(json.dumps(worker(flag)))
    return
  root = common.out_dir()
  sizes = [2000] if common.quick() else [int(n) for n in _SIZES.value]
  queries = 10 if common.quick() else _QUERIES.value
  clips, dim = _CLIPS.value, _DIM.value
  machine = machine_roofline()
  print(f"machine: read {machine['read_GBps']:.1f} GB/s, GEMM {machine['gemm_GFLOPs']:.1f} "
        f"GFLOP/s", flush=True)
  table = (f"{queries} queries over N videos of {clips} clips x 2 streams x {dim}-d; read "
           f"{machine['read_GBps']:.1f} GB/s, GEMM peak {machine['gemm_GFLOPs']:.0f} GFLOP/s "
           "in the same run")
  rows = []

  def record(row: dict, headline: bool = False) -> None:
    gemm = f", {row['compute']} GEMM" if row.get("compute") else ""
    metric = f"{row['n']:,} videos, {row['dtype']} store{gemm}, {row['path']}"
    common.record(SYSTEM, metric, row["seconds"], unit="s", table=table,
                  column=f"s / {queries} queries", digits=3)
    if "roofline_s" in row:
      common.record(SYSTEM, metric, row["x_roofline"], unit="x", table=table,
                    column="x roofline", digits=3)
    common.record(SYSTEM, metric, row["peak_rss_GB"], unit="GB", table=table,
                  column="peak RSS", digits=3)
    recall = row.get("vr_top100_recall", row.get("vr_top100_recall_vs_exhaustive"))
    if recall is not None:
      common.record(SYSTEM, metric, recall, table=table, column="VR top-100 recall",
                    digits=4)
    if headline:
      common.record(SYSTEM, f"exhaustive VCMR, {queries} queries over {row['n']:,} videos "
                    f"({row['x_roofline']:.2f}x the roofline)", row["seconds"], unit="s",
                    headline="speed", digits=3)

  for n in sizes:
    fp32_bytes = 2 * n * len(STREAMS) * clips * dim * 4
    dtypes = ["float32"] if fp32_bytes <= _FP32_MAX.value else ["int8"]
    if n in (10000, 2000):
      dtypes = ["float32", "bfloat16", "int8"]
    ref = None
    for dtype in dtypes:
      store = build(root / f"n{n}_{dtype}", n, dtype, clips=clips, dim=dim)
      flops = 2 * queries * n * len(STREAMS) * clips * dim
      roof = max(store.nbytes_h0 / (machine["read_GBps"] * 1e9),
                 flops / (machine["gemm_GFLOPs"] * 1e9))
      computes = [c for c in _COMPUTE_DTYPES.value if c == "float32" or dtype != "float32"]
      for compute in computes:
        res = run_worker(store.dir, queries, compute_dtype=compute)
        row = {"n": n, "dtype": dtype, "compute": compute, "path": "exhaustive",
               "seconds": res["seconds"], "vr_seconds": res["vr_seconds"],
               "peak_rss_GB": res["peak_rss_GB"], "h0_GB": store.nbytes_h0 / 1e9,
               "read_s": store.nbytes_h0 / (machine["read_GBps"] * 1e9),
               "gemm_s": flops / (machine["gemm_GFLOPs"] * 1e9), "roofline_s": roof,
               "x_roofline": res["seconds"] / roof}
        if ref is None:  # the first row of each N: float32 at 10k
          ref, ref_name = res, f"{dtype} store, {compute} GEMM"
        else:
          row["recall_reference"] = ref_name
          row["vr_top100_recall"] = recall(res["vr"], ref["vr"], 100)
          row["vcmr_top10_in_top100"] = recall(res["vcmr"], ref["vcmr"], 10)
        rows.append(row)
        print(json.dumps(row), flush=True)
        record(row, headline=n == max(sizes) and compute == "float32")
        if compute == "float32":
          exhaustive = res
      if _FAISS.value:
        res = exhaustive
        codes = _FAISS_CODES.value
        if codes == "auto":
          sq8_bytes = n * len(STREAMS) * clips * dim
          codes = "SQ8" if sq8_bytes + store.nbytes_h0 <= _FP32_MAX.value else "PQ32"
        fres = run_worker(store.dir, queries, faiss=True, codes=codes)
        frow = {"n": n, "dtype": dtype, "path": f"FAISS IVF{_NLIST.value},{codes} nprobe "
                f"{_NPROBE.value}, {_FAISS_CLIPS.value} clips/stream",
                "seconds": fres["seconds"], "vr_seconds": fres["vr_seconds"],
                "peak_rss_GB": fres["peak_rss_GB"],
                "index_build_seconds": fres["index_build_seconds"],
                "vr_top100_recall_vs_exhaustive": recall(fres["vr"], res["vr"], 100)}
        rows.append(frow)
        print(json.dumps(frow), flush=True)
        record(frow)
  print(json.dumps({"machine": machine, "rows": rows}))


if __name__ == "__main__":
  common.main(main)
