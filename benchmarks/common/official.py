r"""avtext against the official PyTorch code, same weights: max |diff| of every intermediate.

    make bench-venv   # .venv-bench: requirements.lock + requirements-bench.txt (torch CPU)
    git -C <mirror of jayleicn/TVRetrieval> archive HEAD baselines utils | tar -x -C /tmp/TVRetrieval
    .venv-bench/bin/python benchmarks/parity_official.py --system=xml --official=/tmp/TVRetrieval

  --system=xml   --official=<checkout of jayleicn/TVRetrieval>
  --system=coot  --official=<checkout of gingsi/coot-videotext>
  --system=mmt   --official=<checkout of jayleicn/TVCaption>

Each system's check (benchmarks/parity_<system>.py) builds the official model with random
weights (eval mode, float32), saves its state dict as the official code does, imports it
with `avtext.import_checkpoint` (the same path a researcher uses), feeds both the
same batch, padded as the official collate pads it (items of different lengths), and
compares every intermediate and the training loss. The official code is imported from
--official at run time; nothing of it is vendored here.
"""
import argparse
import datetime
import importlib
import pathlib
import platform
import sys

import numpy as np

TOLERANCE = 1e-4


def max_abs_diff(ours, theirs) -> float:
  ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
  if ours.shape != theirs.shape:
    raise ValueError(f"shapes differ: avtext {ours.shape}, official {theirs.shape}")
  return float(np.max(np.abs(ours - theirs))) if ours.size else 0.0


def report(system: str, rows: list[tuple], extra: list[str]) -> bool:
  """rows: (intermediate, max |diff|, shape[, tolerance]): the row's own tolerance where a
  fourth element gives one (the check says why), else TOLERANCE. Prints a markdown table;
  True if all pass."""
  print(f"## {system}: avtext vs official, {datetime.date.today()}, {platform.node()}, "
        f"float32, tolerance {TOLERANCE:g}\n")
  print("| intermediate | shape | max abs diff | |\n|---|---|---|---|")
  ok = True
  for name, diff, shape, *own in rows:
    tolerance = own[0] if own else TOLERANCE
    good = diff <= tolerance
    ok &= good
    verdict = "ok" if good else "FAIL"
    if own:
      verdict += f" (tolerance {tolerance:.2g})"
    print(f"| {name} | {shape} | {diff:.2e} | {verdict} |")
  for line in extra:
    print(line)
  print(f"\n{'ALL WITHIN' if ok else 'NOT ALL WITHIN'} {TOLERANCE:g}")
  return ok


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--system", required=True, choices=["xml", "coot", "mmt"])
  parser.add_argument("--official", required=True, type=pathlib.Path,
                      help="checkout of the official repository")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()
  if not args.official.is_dir():
    parser.error(f"--official={args.official}: not a directory")
  sys.path.insert(0, str(pathlib.Path(__file__).parent))
  check = importlib.import_module(f"parity_{args.system}")
  rows, extra = check.run(args.official.absolute(), seed=args.seed)
  return 0 if report(args.system, rows, extra) else 1


if __name__ == "__main__":
  sys.exit(main())
