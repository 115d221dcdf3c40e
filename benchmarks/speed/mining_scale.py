r"""VideoCC mining throughput and scaling on the synthetic mining world (issue 12).

    make demo-mining        # writes workdirs/demo/mining/world (the corpus) first
    python benchmarks/mining_scale.py [--world=workdirs/demo/mining/world] \
        [--tower=workdirs/demo/video_pretrain] [--sizes=25,50,100]

Prints markdown:
  1. decode (frames/s at 1 fps, PyAV) and embed (frames/s, the tower on stills) rates;
  2. search: queries/s of the shard search (top 10 videos per seed, best frame each)
     with the exact index and with HNSW / IVF, on the corpus' frames and on 200k frames
     (the corpus' frames plus jittered copies, as 20x more videos), and their recall of
     the exact answer;
  3. the whole pipeline's wall time (`python -m avtext.mine`, 2 direct-runner workers,
     process start included) for corpora of `sizes` videos (the first N of the world);
  4. precision of the mined clips vs τ for the tower and for a colour-histogram f.
"""
import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from avtext.data import video_io  # pylint: disable=wrong-import-position
from avtext.mining import embed  # pylint: disable=wrong-import-position
from avtext.mining import files  # pylint: disable=wrong-import-position
from avtext.mining import search  # pylint: disable=wrong-import-position


def decode_embed(videos, embedder):
  frames, owner, t_dec = [], [], 0.0
  for k, (_, path) in enumerate(videos):
    try:
      t = time.perf_counter()
      info = video_io.probe(path)
      if info.duration_s < 10:
        continue
      x = video_io.read_frames(path, video_io.sample_times(info.duration_s))
      t_dec += time.perf_counter() - t
    except video_io.VideoReadError:
      continue
    frames.append(x)
    owner.append(np.full(len(x), k))
  frames, owner = np.concatenate(frames), np.concatenate(owner)
  embedder(frames[:256])  # compile
  t = time.perf_counter()
  vecs = embedder(frames)
  t_emb = time.perf_counter() - t
  return frames, owner, vecs, len(frames) / t_dec, len(frames) / t_emb


def search_rows(seeds, vecs, owner, label):
  """Exact vs approximate: index build seconds, search queries/s, recall of exact top 10."""
  rows = []
  exact = None
  for name, cfg, force in (
      ("exact (flat)", search.IndexConfig(), True),
      ("HNSW32, efSearch 128", search.IndexConfig(exact_max_frames=0), False),
      ("IVF 4√N lists, nprobe 16", search.IndexConfig(exact_max_frames=0, approx="ivf"), False)):
    t = time.perf_counter()
    index, _ = search.build_index(vecs, cfg, force_exact=force)
    build = time.perf_counter() - t
    got, info = search.search_shard(seeds, vecs, owner, tau=-1.0, top_k=10, index=index)
    if exact is None:
      exact = got
    hits = sum(len({m.video for m in g} & {m.video for m in e}) for g, e in zip(got, exact))
    total = sum(len(e) for e in exact)
    rows.append(f"| {label} | {name} | {len(vecs)} | {build:.2f} | "
                f"{len(seeds) / info['seconds']:.0f} | {100 * hits / total:.1f} |")
  return rows


def mine(world: pathlib.Path, videos_dir: pathlib.Path, embedder: str, out: pathlib.Path,
         taus: str) -> tuple[float, dict]:
  cmd = [sys.executable, "-m", "avtext.mine", f"--seeds={world}/seeds/seeds.tsv",
         f"--videos={videos_dir}", f"--out={out}",
         (f"--workdir={embedder[4:]}" if embedder.startswith("run:") else f"--embedder={embedder}"),
         f"--tau_grid={taus}", "--direct_num_workers=2"]
  t = time.perf_counter()
  proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
  wall = time.perf_counter() - t
  if proc.returncode:
    raise RuntimeError(proc.stderr[-3000:])
  return wall, json.loads((out / "stats.json").read_text())


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--world", default="workdirs/demo/mining/world")
  p.add_argument("--tower", default="workdirs/demo/video_pretrain")
  p.add_argument("--sizes", default="25,50,100")
  p.add_argument("--taus", default="0.6,0.9,0.95,0.97,0.98,0.99")
  p.add_argument("--scratch", default="workdirs/bench/mining")
  p.add_argument("--search_only", action="store_true")
  a = p.parse_args()
  world, scratch = pathlib.Path(a.world), pathlib.Path(a.scratch)
  videos = files.list_videos(world / "videos")
  tower = embed.resolve(f"run:{a.tower}")
  frames, owner, vecs, dec_fps, emb_fps = decode_embed(videos, tower)
  print(f"decode: {dec_fps:.0f} frames/s at 1 fps ({len(frames)} frames of "
        f"{frames.shape[1]}x{frames.shape[2]}); tower embed: {emb_fps:.0f} frames/s")
  seeds = files.read_seeds(world / "seeds" / "seeds.tsv")
  seed_vecs = tower(np.stack([files.load_image(pth, None) for _, pth, _ in seeds]))
  print("\n| frames | index | N | build s | queries/s | recall of exact top 10 (%) |"
        "\n|---|---|---|---|---|---|")
  rows = search_rows(seed_vecs, vecs, owner, "corpus")
  rng = np.random.default_rng(0)
  reps = 200_000 // len(vecs) + 1
  big = np.concatenate([vecs] + [embed.l2_normalize(vecs + 0.05 * rng.normal(size=vecs.shape))
                                 for _ in range(reps - 1)])[:200_000]
  big_owner = np.concatenate([owner + r * (owner.max() + 1) for r in range(reps)])[:200_000]
  rows += search_rows(seed_vecs, big.astype(np.float32), big_owner, "corpus x20, jittered")
  print("\n".join(rows), flush=True)
  if a.search_only:
    return

  print("\n| videos | frames | wall s (command) | pipeline s | frames/s end to end |"
        "\n|---|---|---|---|---|")
  for n in (int(s) for s in a.sizes.split(",")):
    sub = scratch / f"videos_{n}"
    if sub.exists():
      shutil.rmtree(sub)
    sub.mkdir(parents=True)
    for vid, path in videos[:n]:
      (sub / pathlib.Path(path).name).symlink_to(pathlib.Path(path).resolve())
    shutil.copy(world / "videos" / "world.json", sub / "world.json")
    wall, _ = mine(world, sub, f"run:{a.tower}", scratch / f"mined_{n}", a.taus)
    run = json.loads((scratch / f"mined_{n}" / "run.json").read_text())
    print(f"| {n} | {run['frames']} | {wall:.0f} | {run['seconds']:.0f} | "
          f"{run['frames'] / wall:.0f} |", flush=True)

  print("\n| f | τ | matches | clips | videos | captions | precision (%) | matched frame fits (%) |"
        "\n|---|---|---|---|---|---|---|---|")
  n = max(int(s) for s in a.sizes.split(","))
  stats = {"RGB tower (stills)": json.loads((scratch / f"mined_{n}" / "stats.json").read_text())}
  _, stats["colour histogram"] = mine(world, scratch / f"videos_{n}",
                                      "callable:avtext.mining.embed:colour_histogram",
                                      scratch / f"mined_hist_{n}", a.taus)
  for name, st in stats.items():
    for r in st["per_tau"]:
      pr, fr = r.get("precision"), r.get("precision_matched_frame")
      print(f"| {name} | {r['tau']} | {r['matches']} | {r['clips']} | {r['videos']} | "
            f"{r['captions']} | {'-' if pr is None else f'{100 * pr:.1f}'} | "
            f"{'-' if fr is None else f'{100 * fr:.1f}'} |")


if __name__ == "__main__":
  main()
