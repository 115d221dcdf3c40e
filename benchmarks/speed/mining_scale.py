r"""VideoCC mining throughput and scaling on the synthetic mining world (issue 12).

    make demo-mining        # writes workdirs/demo/mining/world (the corpus) first
    python -m benchmarks.speed.mining_scale [--world=workdirs/demo/mining/world] \
        [--tower=workdirs/demo/video_pretrain] [--sizes=25,50,100] [--search_only]

Prints markdown:
  1. decode (frames/s at 1 fps, PyAV) and embed (frames/s, the tower on stills) rates;
  2. search: queries/s of the shard search (top 10 videos per seed, best frame each)
     with the exact index and with HNSW / IVF, on the corpus' frames and on 200k frames
     (the corpus' frames plus jittered copies, as 20x more videos), and their recall of
     the exact answer;
  3. the whole pipeline's wall time (`python -m avtext.mine`, 2 direct-runner workers,
     process start included) for corpora of `sizes` videos (the first N of the world);
  4. precision of the mined clips vs τ for the tower and for a colour-histogram f.
Mined corpora go under --out. --quick: the search on the corpus' frames only. Rows: the
rates, the search table and the pipeline's wall time per corpus size.
"""
import json
import pathlib
import shutil
import subprocess
import sys
import time

from absl import flags
import numpy as np

from avtext.data import video_io
from avtext.mining import beam_files
from avtext.mining import embed
from benchmarks import common
from benchmarks.common import mining as mining_lib

_WORLD = flags.DEFINE_string("world", "workdirs/demo/mining/world", "`make demo-mining`'s world")
_TOWER = flags.DEFINE_string("tower", "workdirs/demo/video_pretrain", "the stage-1 run (f)")
_SIZES = flags.DEFINE_list("sizes", ["25", "50", "100"], "corpus sizes for the pipeline")
_TAUS = flags.DEFINE_string("taus", "0.6,0.9,0.95,0.97,0.98,0.99", "τ grid of the mined stats")
_SEARCH_ONLY = flags.DEFINE_bool("search_only", False, "stop after the search table")
SYSTEM = "VideoCC mining"


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


def mine(world: pathlib.Path, videos_dir: pathlib.Path, embedder: str, out: pathlib.Path,
         taus: str) -> tuple[float, dict]:
  cmd = [sys.executable, "-m", "avtext.mine", f"--seeds={world}/seeds/seeds.tsv",
         f"--videos={videos_dir}", f"--out={out}",
         (f"--workdir={embedder[4:]}" if embedder.startswith("run:") else f"--embedder={embedder}"),
         f"--tau_grid={taus}", "--direct_num_workers=2"]
  t = time.perf_counter()
  proc = subprocess.run(cmd, cwd=common.REPO, capture_output=True, text=True)
  wall = time.perf_counter() - t
  if proc.returncode:
    raise RuntimeError(proc.stderr[-3000:])
  return wall, json.loads((out / "stats.json").read_text())


def main(argv):
  del argv
  world, scratch = pathlib.Path(_WORLD.value), common.out_dir()
  videos = beam_files.list_videos(world / "videos")
  tower = embed.resolve(f"run:{_TOWER.value}")
  frames, owner, vecs, dec_fps, emb_fps = decode_embed(videos, tower)
  print(f"decode: {dec_fps:.0f} frames/s at 1 fps ({len(frames)} frames of "
        f"{frames.shape[1]}x{frames.shape[2]}); tower embed: {emb_fps:.0f} frames/s")
  rates = f"{len(frames)} frames of {frames.shape[1]}x{frames.shape[2]}, one process"
  common.record(SYSTEM, "decode at 1 fps (PyAV, from one seek)", dec_fps, unit="frames/s",
                table=rates, digits=3)
  common.record(SYSTEM, "the stage-1 tower on stills (batch 128, compiled)", emb_fps,
                unit="frames/s", table=rates, digits=3)
  seeds = beam_files.read_seeds(world / "seeds" / "seeds.tsv")
  seed_vecs = tower(np.stack([beam_files.load_image(pth, None) for _, pth, _ in seeds]))
  table = f"shard search: {len(seeds)} seed queries, top 10 videos a seed, one process"
  rows = mining_lib.search_rows(seed_vecs, vecs, owner, "corpus")
  if not common.quick():
    rng = np.random.default_rng(0)
    reps = 200_000 // len(vecs) + 1
    big = np.concatenate([vecs] + [embed.l2_normalize(vecs + 0.05 * rng.normal(size=vecs.shape))
                                   for _ in range(reps - 1)])[:200_000]
    big_owner = np.concatenate([owner + r * (owner.max() + 1) for r in range(reps)])[:200_000]
    rows += mining_lib.search_rows(seed_vecs, big.astype(np.float32), big_owner,
                                   "corpus x20, jittered")
  mining_lib.record_search(SYSTEM, table, rows)
  if _SEARCH_ONLY.value or common.quick():
    return

  print("\n| videos | frames | wall s (command) | pipeline s | frames/s end to end |"
        "\n|---|---|---|---|---|")
  sizes = [int(s) for s in _SIZES.value]
  table = "`python -m avtext.mine` on the first N videos, direct runner, 2 workers"
  for n in sizes:
    sub = scratch / f"videos_{n}"
    if sub.exists():
      shutil.rmtree(sub)
    sub.mkdir(parents=True)
    for _, path in videos[:n]:
      (sub / pathlib.Path(path).name).symlink_to(pathlib.Path(path).resolve())
    shutil.copy(world / "videos" / "world.json", sub / "world.json")
    wall, _ = mine(world, sub, f"run:{_TOWER.value}", scratch / f"mined_{n}", _TAUS.value)
    run = json.loads((scratch / f"mined_{n}" / "run.json").read_text())
    print(f"| {n} | {run['frames']} | {wall:.0f} | {run['seconds']:.0f} | "
          f"{run['frames'] / wall:.0f} |", flush=True)
    metric = f"{n} videos, {run['frames']} frames"
    common.record(SYSTEM, metric, round(wall), unit="s", table=table,
                  column="wall (command)")
    common.record(SYSTEM, metric, round(run["seconds"]), unit="s", table=table,
                  column="pipeline")
    common.record(SYSTEM, metric, run["frames"] / wall, table=table,
                  column="frames/s end to end", digits=3)
    if n == max(sizes):
      common.record(SYSTEM, "frames/s end to end on 2 cores", run["frames"] / wall,
                    headline="speed", digits=3)

  print("\n| f | τ | matches | clips | videos | captions | precision (%) | matched frame fits (%) |"
        "\n|---|---|---|---|---|---|---|---|")
  n = max(sizes)
  stats = {"RGB tower (stills)": json.loads((scratch / f"mined_{n}" / "stats.json").read_text())}
  _, stats["colour histogram"] = mine(world, scratch / f"videos_{n}",
                                      "callable:avtext.mining.embed:colour_histogram",
                                      scratch / f"mined_hist_{n}", _TAUS.value)
  for name, st in stats.items():
    for r in st["per_tau"]:
      pr, fr = r.get("precision"), r.get("precision_matched_frame")
      print(f"| {name} | {r['tau']} | {r['matches']} | {r['clips']} | {r['videos']} | "
            f"{r['captions']} | {'-' if pr is None else f'{100 * pr:.1f}'} | "
            f"{'-' if fr is None else f'{100 * fr:.1f}'} |")


if __name__ == "__main__":
  common.main(main)
