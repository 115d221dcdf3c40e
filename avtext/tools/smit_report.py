r"""`make demo-smit`'s closing table: the S-MiT caption models side by side on test.

    python -m avtext.tools.smit_report --run="language=workdirs/demo/smit_p1" \
        --run="ASR text=workdirs/demo/smit_asr_eval" \
        --run="spoken=workdirs/demo/smit_spoken_p1" --asr=workdirs/demo/smit_asr

Each --run is NAME=DIR, a run or --eval_dir whose results.json holds a test report in
S-MiT's protocol (5 x 1k subsets): the best checkpoint on val's when it has one (the
`--mode=eval --step=best` report; a training run also tests its last step), else the
newest. One row each, then chance (1 / subset size) and the oracle's
caption->video R@1 on the same subsets (a line per set of test clips where the runs'
differ), and the ASR engine's WER against the captions (--asr: the directory
of the demo world's ASR tool, `smit_asr`).
"""
import json
import pathlib

from absl import flags

from avtext import cli
from avtext import errors

FLAGS = flags.FlagValues()
_RUNS = flags.DEFINE_multi_string("run", [], "NAME=DIR of a run with an S-MiT test report",
                                  flag_values=FLAGS)
_ASR = cli.DEFINE_path("asr", None, "the demo world's ASR tool's output directory",
                       flag_values=FLAGS)

COLS = ("R@1", "R@5", "R@10", "mAP")
DIRECTIONS = (("caption_to_video", "c2v"), ("video_to_caption", "v2c"), ("mean", "mean"))


def test_report(run_dir: str | pathlib.Path) -> tuple[int, dict]:
  """(step, metrics) of the test report in the S-MiT protocol of `run_dir`: the best
  checkpoint's on val when it has one, else the newest."""
  path = pathlib.Path(run_dir) / "results.json"
  if not path.is_file():
    raise errors.BadInput(f"--run: {path} does not exist; train and evaluate the run first")
  results = json.loads(path.read_text())
  steps = [int(s) for s, r in results.items() if s.isdigit() and isinstance(r, dict)
           and "test/subset/mean/R@1" in r]
  if not steps:
    raise errors.BadInput(f"--run: {path} has no test report in S-MiT's protocol "
                          f"(test/subset/...); run --mode=eval on it")
  best = (results.get("best") or {}).get("step")
  step = int(best) if best is not None and int(best) in steps else max(steps)
  return step, results[str(step)]


def table(runs: list[tuple[str, str]], asr_dir: str | None = None) -> str:
  head = " | ".join(f"{short} {c}" for _, short in DIRECTIONS for c in COLS)
  lines = [f"| model | step | {head} |", "|---" * (2 + 3 * len(COLS)) + "|"]
  oracles = {}  # name -> the oracle on its test subsets (runs may test other clips)
  for name, run_dir in runs:
    step, r = test_report(run_dir)
    cells = [f"{r[f'test/subset/{d}/{c}']:.1f}±{r[f'test/subset/{d}/{c}_std']:.1f}"
             for d, _ in DIRECTIONS for c in COLS]
    lines.append(f"| {name} | {step} | " + " | ".join(cells) + " |")
    if "test/subset/oracle_t2v_R@1" in r:
      oracles[name] = r["test/subset/oracle_t2v_R@1"]
  # R@k of a random ranking of 1000 videos (captions): k / 1000.
  chance = [f"{int(c[2:]) / 10:.1f}" if c.startswith("R@") else "" for _ in DIRECTIONS
            for c in COLS]
  lines.append("| chance (1k subsets) | | " + " | ".join(chance) + " |")
  by_value = {}
  for name, value in oracles.items():
    by_value.setdefault(round(value, 1), []).append(name)
  for value, names in by_value.items():
    which = "" if len(by_value) == 1 else f" ({', '.join(names)})"
    lines.append(f"| oracle{which} | | {value:.1f} |" + " |" * (3 * len(COLS) - 1))
  out = "\n".join(lines)
  if asr_dir:
    for path in sorted(pathlib.Path(asr_dir).glob("*.json")):
      a = json.loads(path.read_text())
      out += (f"\nASR (pocketsphinx, LM: {a['lm']}) on {path.stem}: WER {100 * a['wer']:.1f} % "
              f"over {a['num_words']} words of {a['num_clips']} spoken captions")
  return out


def main(argv):
  if len(argv) > 1:
    raise errors.BadInput(f"unexpected arguments {list(argv[1:])}; see --help")
  runs = []
  for spec in _RUNS.value:
    name, sep, run_dir = spec.partition("=")
    if not sep or not name or not run_dir:
      raise errors.BadInput(f"--run={spec!r}: expected NAME=DIR, e.g. --run=spoken=workdirs/x")
    runs.append((name, run_dir))
  if not runs:
    raise errors.BadInput("no --run given: name at least one NAME=DIR")
  print(table(runs, _ASR.value))


if __name__ == "__main__":
  cli.run(main, FLAGS)
