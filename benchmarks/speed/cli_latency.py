r"""Latency of the command-line programs with an empty and with a warm JAX compilation cache.

    make workdirs/demo/avr/results.json        # the demo's AVR run
    python benchmarks/cli_latency.py [--run=workdirs/demo/avr] [--repeats=3] \
        [--out=workdirs/bench/cli_latency]

Indexes 8 videos of the synthetic test world with the run (once), then times, as whole
processes (start-up, imports, loading the run, compiling, answering):

  search   python -m avtext.search_videos --index=INDEX "a caption"

`--repeats` times cold (AVTEXT_COMPILATION_CACHE = a new empty directory) and warm
(a directory filled by an earlier run of the same command), alternating cold and warm,
and prints markdown: the median seconds of each and the cold / warm ratio.
"""
import argparse
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import index_throughput  # pylint: disable=wrong-import-position


def timed(cmd: list[str], cache: pathlib.Path, runs: bool = True) -> float:
  """Seconds of `cmd` with its caches under `cache`: JAX's compilation cache and (with
  `runs`, else off) the run cache of checkpoint snapshots."""
  env = dict(os.environ, AVTEXT_COMPILATION_CACHE=str(cache / "jax"),
             AVTEXT_RUN_CACHE=str(cache / "runs") if runs else "off")
  start = time.perf_counter()
  subprocess.run(cmd, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL)
  return time.perf_counter() - start


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--run", default="workdirs/demo/avr")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--out", default="workdirs/bench/cli_latency")
  a = p.parse_args()
  out = pathlib.Path(a.out).absolute()
  run = pathlib.Path(a.run).absolute()
  from avtext.data.synthetic import world  # pylint: disable=g-import-not-at-top
  captions = index_throughput.own_videos(out, 8, world.WorldSpec())
  index = out / "index"
  if not (index / "meta.json").exists():
    subprocess.run([sys.executable, "-m", "avtext.index", f"--workdir={run}",
                    f"--videos={out / 'videos'}", f"--out={index}"], cwd=REPO, check=True,
                   env=dict(os.environ, AVTEXT_COMPILATION_CACHE="off"))
  commands = {
      "search": [sys.executable, "-m", "avtext.search_videos", f"--index={index}",
                 next(iter(captions.values()))],
  }
  print("| command | cold s | warm: compilation cache only, s | warm: both caches, s | "
        "cold / warm (compilation only) | cold / warm (both) |")
  print("|---|---|---|---|---|---|")
  for name, cmd in commands.items():
    warm_dir = out / f"cache_warm_{name}"
    shutil.rmtree(warm_dir, ignore_errors=True)
    timed(cmd, warm_dir)  # fills both caches
    cold, compiled, warm = [], [], []
    for k in range(a.repeats):
      cold_dir = out / f"cache_cold_{name}_{k}"
      shutil.rmtree(cold_dir, ignore_errors=True)
      cold.append(timed(cmd, cold_dir))
      compiled.append(timed(cmd, warm_dir, runs=False))
      warm.append(timed(cmd, warm_dir))
      shutil.rmtree(cold_dir, ignore_errors=True)
    c, j, w = (statistics.median(x) for x in (cold, compiled, warm))
    print(f"| {name} | {c:.2f} | {j:.2f} | {w:.2f} | {c / j:.2f}x | {c / w:.2f}x |", flush=True)


if __name__ == "__main__":
  main()
