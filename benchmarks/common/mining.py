"""The shard search measured alone, for the mining scale benchmarks
(benchmarks/speed/mining_scale.py, mining_dask_scale.py)."""
import time

INDEXES = ("exact (flat)", "HNSW32, efSearch 128", "IVF 4√N lists, nprobe 16")


def search_rows(seeds, vecs, owner, label: str) -> list[dict]:
  """Exact vs approximate shard search (top 10 videos per seed, best frame each): index
  build seconds, queries/s, and recall of the exact top 10, one dict per index."""
  from avtext.mining import search  # pylint: disable=g-import-not-at-top
  rows, exact = [], None
  for name, cfg, force in (
      (INDEXES[0], search.IndexConfig(), True),
      (INDEXES[1], search.IndexConfig(exact_max_frames=0), False),
      (INDEXES[2], search.IndexConfig(exact_max_frames=0, approx="ivf"), False)):
    start = time.perf_counter()
    index, _ = search.build_index(vecs, cfg, force_exact=force)
    build = time.perf_counter() - start
    got, info = search.search_shard(seeds, vecs, owner, tau=-1.0, top_k=10, index=index)
    if exact is None:
      exact = got
    hits = sum(len({m.video for m in g} & {m.video for m in e}) for g, e in zip(got, exact))
    rows.append({"frames": label, "index": name, "n": len(vecs), "build_s": build,
                 "queries_per_s": len(seeds) / info["seconds"],
                 "recall_pct": 100 * hits / sum(len(e) for e in exact)})
  print("\n| frames | index | N | build s | queries/s | recall of exact top 10 (%) |"
        "\n|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['frames']} | {r['index']} | {r['n']} | {r['build_s']:.2f} | "
          f"{r['queries_per_s']:.0f} | {r['recall_pct']:.1f} |", flush=True)
  return rows


def record_search(system: str, table: str, rows: list[dict]) -> None:
  from benchmarks import common  # pylint: disable=g-import-not-at-top
  for r in rows:
    metric = f"{r['frames']}, N {r['n']}: {r['index']}"
    common.record(system, metric, r["build_s"], unit="s", table=table, column="build")
    common.record(system, metric, r["queries_per_s"], table=table, column="queries/s",
                  digits=4)
    common.record(system, metric, r["recall_pct"], unit="%", table=table,
                  column="recall of exact top 10")
