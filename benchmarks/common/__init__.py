r"""What every benchmark script shares: its flags, its rows in the results store, timing.

A benchmark is an absl program run from the repository root as a module,

    python -m benchmarks.<genre>.<name> [--quick] [--out=DIR] [--results=FILE] [its flags]

that imports only `avtext` and this package. `main(fn)` defines the flags every script has:

  --out      the directory for the script's own files (runs, scratch data, raw outputs);
             default workdirs/bench/<name>
  --quick    a small, fast run that exercises the script end to end; its rows are
             printed, not stored
  --results  the results store its rows are appended to (default benchmarks/results.jsonl;
             empty: print only)
  --machine  how its rows name this machine (default $AVTEXT_BENCH_MACHINE, else the CPU
             model and core count)

`record(...)` appends one row (`benchmarks.report.FIELDS`) with the command that
reproduces it, the commit, the machine and the date; `python -m benchmarks.report` writes
BENCHMARKS.md from the latest row of each metric. Importing this package defines no flag
and imports nothing heavy (tests use its helpers).
"""
import datetime
import json
import os
import pathlib
import platform
import re
import shlex
import subprocess
import sys
import time
from typing import Callable

from benchmarks import report

REPO = report.ROOT
_FLAGS_DEFINED = []


def _define_flags() -> None:
  from absl import flags  # pylint: disable=g-import-not-at-top
  if _FLAGS_DEFINED:
    return
  flags.DEFINE_string("out", None, "directory for this benchmark's own files "
                      "(default workdirs/bench/<name>)")
  flags.DEFINE_bool("quick", False, "a small, fast run (its rows are printed, not stored)")
  flags.DEFINE_string("results", str(report.STORE.relative_to(REPO)),
                      "the results store to append rows to (empty: print only)")
  flags.DEFINE_string("machine", os.environ.get("AVTEXT_BENCH_MACHINE"),
                      "the machine's name in the rows (default: CPU model and cores)")
  _FLAGS_DEFINED.append(True)


def main(fn: Callable) -> None:
  """absl's app.run(fn) with the shared flags defined; --help prints the script's docstring
  and its flags (its own, then the shared ones) and exits 0."""
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  _define_flags()
  if set(sys.argv[1:]) & {"--help", "-h", "-?", "--helpshort"}:
    by_module = flags.FLAGS.flags_by_module_dict()
    mine = [m for m in by_module if m == sys.argv[0] or m.startswith("benchmarks.")]
    mine.sort(key=lambda m: (m == __name__, m))  # the script's own flags first
    print((sys.modules["__main__"].__doc__ or "").strip() + "\n\nflags:\n" + "\n".join(
        flags.FLAGS.module_help(m) for m in mine))
    sys.exit(0)
  from avtext import cli  # pylint: disable=g-import-not-at-top
  cli.quiet_tpu_probe()  # as the package's programs: no libtpu probe warnings on a CPU host
  cli.safe_cpu_collectives()
  app.run(fn)


def _flag(name: str):
  from absl import flags  # pylint: disable=g-import-not-at-top
  return flags.FLAGS[name].value if name in flags.FLAGS else None


def module() -> str:
  """The running script's module, e.g. "benchmarks.speed.generate"."""
  spec = getattr(sys.modules["__main__"], "__spec__", None)
  if spec is None or not spec.name.startswith("benchmarks."):
    raise RuntimeError("run a benchmark as a module from the repository root: "
                       "python -m benchmarks.<genre>.<name>")
  return spec.name


def benchmark() -> str:
  """The script's id in the store: "speed.generate"."""
  return module().removeprefix("benchmarks.")


def quick() -> bool:
  return bool(_flag("quick"))


def out_dir() -> pathlib.Path:
  """--out (default workdirs/bench/<name>), created; a quick run works in its quick/."""
  out = pathlib.Path(_flag("out") or REPO / "workdirs" / "bench" / benchmark().split(".")[-1])
  out = out / "quick" if quick() else out
  out.mkdir(parents=True, exist_ok=True)
  return out


def child(*args: str) -> list[str]:
  """argv that runs this script again in a child process (cwd: the repository root)."""
  return [sys.executable, "-m", module(), *args]


# ---------------------------------------------------------------- rows

def _placeholder(arg: str) -> str:
  """An argument with absolute paths of this machine made repository-relative or named."""
  name, eq, value = arg.partition("=")
  if not eq:
    name, value = "", arg
  if not value.startswith(("/", "~")):
    return arg
  path = pathlib.Path(value).expanduser()
  try:
    return f"{name}{eq}{path.resolve().relative_to(REPO)}"
  except ValueError:
    return f"{name}{eq}<{name.lstrip('-') or 'path'}>"


def command() -> str:
  """The command that reproduces this run, from the repository root."""
  python = (".venv-bench/bin/python" if pathlib.Path(sys.prefix).name == ".venv-bench"
            else "python")
  words = [python, "-m", module()] + [_placeholder(a) for a in sys.argv[1:]]
  return " ".join(w if re.fullmatch(r"[\w@%+=:,./<>|-]+", w) else shlex.quote(w) for w in words)


def commit() -> str:
  try:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True,
                          capture_output=True, check=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                           text=True, capture_output=True, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return ""
  return head + ("+changes" if dirty else "")


def cpu_name() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def machine() -> str:
  return _flag("machine") or f"{os.cpu_count()}-core {cpu_name()}"


def rounded(value, digits: int = 4):
  """Floats to `digits` significant digits (what the report shows); others as they are."""
  if isinstance(value, float):
    return float(f"{value:.{digits}g}")
  return value


def record(system: str, metric: str, value, *, unit: str = "", table: str = "",
           column: str | None = None, std=None, peer=None, peer_name: str | None = None,
           headline: str | None = None, digits: int = 4) -> dict:
  """Appends one row to the results store (printed only with --quick or --results=)."""
  row = {"benchmark": benchmark(), "system": system, "table": table, "metric": metric,
         "column": column, "value": rounded(value, digits),
         "std": rounded(std, digits), "unit": unit, "peer": rounded(peer, digits),
         "peer_name": peer_name, "headline": headline, "command": command(),
         "commit": commit(), "machine": machine(),
         "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat()}
  row = {k: row[k] for k in report.FIELDS if row[k] not in (None, "") or k in report.REQUIRED}
  problems = report.row_problems(row)
  if problems:
    raise ValueError(f"record({metric!r}): " + "; ".join(problems))
  store = _flag("results")
  if quick() or not store:
    print(f"row (not stored): {json.dumps(row)}", flush=True)
  else:
    with open(REPO / store if not os.path.isabs(store) else store, "a") as f:
      f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"row: {table + ': ' if table else ''}{metric}"
          f"{' / ' + column if column else ''} = {report.with_unit(row['value'], unit)}",
          flush=True)
  return row


def stored_rows() -> list[dict]:
  """The latest row of each metric in the results store (what BENCHMARKS.md shows): for a
  script that sets a new measurement beside a stored one."""
  return report.latest(report.read_rows())


def train_and_test_best(config: str, args: list[str], workdir: pathlib.Path) -> dict:
  """Trains `python -m avtext.main --config=<config> --workdir=<workdir> <args>`, then
  evaluates its best checkpoint (`--mode=eval --step=best`); a workdir where both finished
  is reused. Returns its results.json (`best_eval`: the seconds both took)."""
  results_file = workdir / "results.json"
  if not results_file.exists() or "best_eval" not in json.loads(results_file.read_text()):
    begin = time.time()
    command = [sys.executable, "-m", "avtext.main", f"--config={config}",
               f"--workdir={workdir}", *args]
    subprocess.run(command, check=True, cwd=REPO)
    subprocess.run(command + ["--mode=eval", "--step=best"], check=True, cwd=REPO)
    results = json.loads(results_file.read_text())
    results["best_eval"] = {"seconds": time.time() - begin}
    results_file.write_text(json.dumps(results, indent=2, sort_keys=True))
  return json.loads(results_file.read_text())


# ---------------------------------------------------------------- timing and inputs

def timed(fn: Callable[[], object], repeats: int, warmup: int = 1) -> list[float]:
  """Seconds of `repeats` calls of fn after `warmup` untimed ones."""
  for _ in range(warmup):
    fn()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return times


def rate(fn: Callable[[int], object], n: int, threads: int = 1) -> float:
  """Calls/s of fn(0..n-1) after one warm call of fn(0), on `threads` threads."""
  import concurrent.futures  # pylint: disable=g-import-not-at-top
  fn(0)
  start = time.perf_counter()
  if threads == 1:
    for i in range(n):
      fn(i)
  else:
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
      list(pool.map(fn, range(n)))
  return n / (time.perf_counter() - start)


def load_config(spec: str, overrides: tuple[str, ...] = ()):
  """`configs/<x>.py[:variant]` (relative to the repository root) with each
  "dotted.key=value" of `overrides` applied (the value read as a Python literal, else as a
  string; "key=" is the empty string), as --config.dotted.key=value would."""
  import ast  # pylint: disable=g-import-not-at-top
  import importlib.util  # pylint: disable=g-import-not-at-top
  path, _, arg = spec.partition(":")
  loaded = importlib.util.spec_from_file_location("benchmark_config", REPO / path)
  config_module = importlib.util.module_from_spec(loaded)
  loaded.loader.exec_module(config_module)
  config = config_module.get_config(arg or None)
  for item in overrides:
    name, eq, text = item.partition("=")
    if not eq:
      raise ValueError(f"{item!r}: expected dotted.key=value")
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      value = text
    *parents, leaf = name.split(".")
    node = config
    for part in parents:
      node = node[part]
    if leaf not in node:
      raise KeyError(f"{item!r}: the config has no field {name!r}")
    node[leaf] = value
  return config


def import_checkout(path: str | os.PathLike, *more: str | os.PathLike,
                    packages: tuple[str, ...] = ()) -> None:
  """Makes an external checkout (official code, scenic) importable: its directory, then
  `more` folders, go first on sys.path. `packages`: top-level names the checkout shares with
  another one (TVRetrieval and TVCaption both have `baselines` and `utils`), whose modules
  already imported from elsewhere are forgotten, so the next import reads this checkout's.
  Benchmark scripts never edit sys.path themselves."""
  for entry in reversed([path, *more]):
    entry = str(pathlib.Path(entry).resolve())
    if entry in sys.path:
      sys.path.remove(entry)
    sys.path.insert(0, entry)
  root = str(pathlib.Path(path).resolve()) + os.sep
  for name in [n for n in sys.modules if n.split(".")[0] in packages]:
    if not (getattr(sys.modules[name], "__file__", None) or "").startswith(root):
      del sys.modules[name]


def own_videos(out: pathlib.Path, n: int, spec=None) -> dict[str, str]:
  """A folder `out`/videos of n mp4s of the synthetic world's test split (64x64, 10 s by
  default, MSR-VTT layout); {file name: its caption}."""
  import shutil  # pylint: disable=g-import-not-at-top
  from avworld import layouts  # pylint: disable=g-import-not-at-top
  from avworld import world  # pylint: disable=g-import-not-at-top
  spec = spec or world.WorldSpec()
  written = layouts.write("msrvtt", out / "layout", sizes={"test": n}, spec=spec)
  folder = out / "videos"
  folder.mkdir(parents=True, exist_ok=True)
  captions = {}
  for _, stem, caps in written.items["test"]:
    if not (folder / f"{stem}.mp4").exists():
      shutil.copy(out / "layout" / "videos" / "all" / f"{stem}.mp4", folder / f"{stem}.mp4")
    captions[f"{stem}.mp4"] = caps[0]
  return captions


def caption_recall(searcher, captions: dict[str, str], ks=(1, 5)) -> tuple[dict, float]:
  """({k: % of videos whose caption ranks them in the top k}, queries/s) of an
  `avtext.search_videos.IndexSearcher` over `own_videos`."""
  names = list(captions)
  start = time.perf_counter()
  found = searcher.texts([captions[v] for v in names], top=max(ks))
  qps = len(names) / (time.perf_counter() - start)
  share = {k: 100.0 * sum(v in [x for x, _ in f[:k]] for v, f in zip(names, found)) / len(names)
           for k in ks}
  return share, qps
