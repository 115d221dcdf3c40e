r"""Latency of the command-line programs with an empty and with a warm JAX compilation cache.

    make workdirs/demo/avr/results.json        # the demo's AVR run
    python -m benchmarks.speed.cli_latency [--run=workdirs/demo/avr] [--repeats=5] \
        [--out=workdirs/bench/cli_latency]

Indexes 8 videos of the synthetic test world with the run (once), then times, as whole
processes (start-up, imports, loading the run, compiling, answering):

  search   python -m avtext.search_videos --index=INDEX "a caption"

`--repeats` times cold (AVTEXT_COMPILATION_CACHE = a new empty directory, no run cache),
warm with the compilation cache only (AVTEXT_RUN_CACHE=off) and warm with both,
alternating, and prints markdown: the median seconds of each and the cold / warm ratios.
--quick: one repeat. Rows: the three medians and the two ratios.
"""
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

from absl import flags

from benchmarks import common

_RUN = flags.DEFINE_string("run", "workdirs/demo/avr", "an AVR run directory")
_REPEATS = flags.DEFINE_integer("repeats", 3, "cold / warm pairs timed")
SYSTEM = "Own videos"


def timed(cmd: list[str], cache: pathlib.Path, runs: bool = True) -> float:
  """Seconds of `cmd` with its caches under `cache`: JAX's compilation cache and (with
  `runs`, else off) the run cache of checkpoint snapshots."""
  env = dict(os.environ, AVTEXT_COMPILATION_CACHE=str(cache / "jax"),
             AVTEXT_RUN_CACHE=str(cache / "runs") if runs else "off")
  start = time.perf_counter()
  subprocess.run(cmd, cwd=common.REPO, env=env, check=True, stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL)
  return time.perf_counter() - start


def main(argv):
  del argv
  out = common.out_dir().absolute()
  run = pathlib.Path(_RUN.value).absolute()
  repeats = 1 if common.quick() else _REPEATS.value
  captions = common.own_videos(out, 8)
  index = out / "index"
  if not (index / "meta.json").exists():
    subprocess.run([sys.executable, "-m", "avtext.index", f"--workdir={run}",
                    f"--videos={out / 'videos'}", f"--out={index}"], cwd=common.REPO,
                   check=True, env=dict(os.environ, AVTEXT_COMPILATION_CACHE="off"))
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
    for k in range(repeats):
      cold_dir = out / f"cache_cold_{name}_{k}"
      shutil.rmtree(cold_dir, ignore_errors=True)
      cold.append(timed(cmd, cold_dir))
      compiled.append(timed(cmd, warm_dir, runs=False))
      warm.append(timed(cmd, warm_dir))
      shutil.rmtree(cold_dir, ignore_errors=True)
    c, j, w = (statistics.median(x) for x in (cold, compiled, warm))
    print(f"| {name} | {c:.2f} | {j:.2f} | {w:.2f} | {c / j:.2f}x | {c / w:.2f}x |", flush=True)
    table = f"`python -m avtext.search_videos` over an index of 8 videos, median of {repeats}"
    metric = name
    for column, value, unit in (("cold", c, "s"), ("warm: compilation cache only", j, "s"),
                                ("warm: both caches", w, "s"),
                                ("cold / warm (compilation only)", c / j, "x"),
                                ("cold / warm (both)", c / w, "x")):
      common.record(SYSTEM, metric, value, unit=unit, table=table, column=column, digits=3)
    common.record(SYSTEM, "`search_videos` cold start / warm start", c / w, unit="x",
                  headline="speed", digits=3)


if __name__ == "__main__":
  common.main(main)
