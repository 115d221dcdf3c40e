r"""Scores a TVR submission file: VCMR / SVMR / VR R@{1,5,10,100} at IoU 0.5 / 0.7.

    python -m avtext.tools.tvr_eval --submission=workdirs/demo/xml/moments/test_step840.json \
        --ground_truth=workdirs/demo/tvr_data/tvr_test_public_release.jsonl \
        [--official_script=/path/to/TVRetrieval/standalone_eval/eval.py]

The numbers are `avtext.metrics.vcmr.evaluate_predictions`'s (equal to the
official standalone_eval/eval.py). With `--official_script`, that script (not part of
avtext; a checkout of jayleicn/TVRetrieval) is run on the same files and every metric
is compared; the exit status is 1 when any differs. A ground truth without moments (TVR's
released test_public hides each query's video and span) cannot be scored: one line says
so; its submission goes to TVR's evaluation server (docs/tvr.md, "Submitting").
"""
import json
import math
import pathlib
import subprocess
import sys
import tempfile
from typing import Sequence

from absl import flags

from avtext import cli
from avtext import errors
from avtext.data.builders import tvc
from avtext.metrics import vcmr


def table(results: dict) -> str:
  lines = [" " * 12 + "".join(f"R@{k:<7d}" for k in (1, 5, 10, 100))]
  for task in ("VCMR", "SVMR", "VR"):
    if task not in results:
      continue
    for thd in ((None,) if task == "VR" else ("0.5", "0.7")):
      key = "r" if thd is None else f"{thd}-r"
      lines.append(f"{task + ('' if thd is None else ' ' + thd):<12s}" + "".join(
          f"{results[task][f'{key}{k}']:<9.2f}" for k in (1, 5, 10, 100)))
  return "\n".join(lines)


def differences(ours: dict, official: dict) -> list[str]:
  out = []
  for task in sorted(set(ours) | set(official)):
    a, b = ours.get(task, {}), official.get(task, {})
    for key in sorted(set(a) | set(b)):
      x, y = a.get(key), b.get(key)
      same = x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x)
                        and math.isnan(y))
      if not same:
        out.append(f"{task}/{key}: avtext {x!r}, official {y!r}")
  return out


def score(submission: str, ground_truth: str) -> dict:
  """`vcmr.evaluate_predictions` of the files, with one-line errors (errors.BadInput) for
  a ground truth without moments (the released test_public) and a submission of another
  shape."""
  cli.check_input_file("submission", submission)
  cli.check_input_file("ground_truth", ground_truth)
  truth = tvc.read_jsonl(pathlib.Path(ground_truth), "ground truth")
  hidden = [n for n, row in enumerate(truth, 1)
            if not isinstance(row, dict) or "vid_name" not in row or "ts" not in row]
  if hidden:
    raise errors.BadInput(
        f"--ground_truth={ground_truth}: cannot be scored: {len(hidden)} of its {len(truth)} "
        f"lines (the first: line {hidden[0]}) have no 'vid_name' / 'ts', the moment a query "
        "describes (TVR's released test_public hides them); upload the submission to TVR's "
        "evaluation server (docs/tvr.md), or score the val split")
  try:
    return vcmr.evaluate_predictions(submission, truth)
  except (ValueError, KeyError, TypeError, IndexError) as e:  # JSON of another shape
    raise errors.BadInput(f"--submission={submission}: not a TVR submission "
                          f"({cli.exception_message(e)}); expected {{\"video2idx\", \"VCMR\", "
                          "\"SVMR\", \"VR\": [{\"desc_id\", \"predictions\"}, ...]} "
                          "(TVRetrieval standalone_eval/README.md)") from e


FLAGS = flags.FlagValues()
_SUBMISSION = cli.DEFINE_path("submission", None, "the submission JSON (the moments "
                              "evaluator's export)", flag_values=FLAGS)
_GROUND_TRUTH = cli.DEFINE_path("ground_truth", None, "tvr_<split>_release.jsonl",
                                flag_values=FLAGS)
_OFFICIAL = cli.DEFINE_path("official_script", None, "TVRetrieval's standalone_eval/eval.py: "
                            "also run it and compare every metric", flag_values=FLAGS)
flags.mark_flags_as_required(["submission", "ground_truth"], flag_values=FLAGS)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise errors.BadInput(f"unexpected arguments {list(argv[1:])}; see --help")
  ours = score(_SUBMISSION.value, _GROUND_TRUTH.value)
  print(f"{_SUBMISSION.value}\n{table(ours)}")
  if not _OFFICIAL.value:
    return
  with tempfile.NamedTemporaryFile(suffix=".json") as out:
    subprocess.run([sys.executable, _OFFICIAL.value, "--submission_path", _SUBMISSION.value,
                    "--gt_path", _GROUND_TRUTH.value, "--save_path", out.name,
                    "--not_verbose"], check=True)
    official = json.loads(open(out.name, encoding="utf-8").read())
  diff = differences(ours, official)
  n = sum(len(v) for v in ours.values())
  print(f"official script: {'all ' + str(n) + ' metrics equal' if not diff else 'DIFFERS'}")
  for line in diff:
    print("  " + line)
  if diff:
    sys.exit(1)


if __name__ == "__main__":
  cli.run(main, FLAGS)
