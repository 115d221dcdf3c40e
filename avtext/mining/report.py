"""Print a mining run's statistics beside zero-shot retrieval of AVR runs trained on what
it mined and on ground truth:

    python -m avtext.mining.report --mined=DIR --run=mined:RUN_DIR --run="ground truth:RUN_DIR"
"""
import argparse
import json
import pathlib

from avtext.train import rundir


def test_metrics(workdir: str) -> tuple[int, dict]:
  """(step, test metrics) of a run's last evaluated step."""
  results = rundir.read_json(pathlib.Path(workdir) / rundir.RESULTS_FILE,
                            fix="re-running the run's training command rebuilds it")
  steps = sorted((int(k) for k in results if k.isdigit() and any(
      m.startswith('test/') for m in results[k])), reverse=True)
  if not steps:
    raise FileNotFoundError(f'{workdir}/results.json: no test evaluation yet')
  return steps[0], results[str(steps[0])]


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--mined', required=True)
  p.add_argument('--run', action='append', default=[], help='NAME:RUN_DIR (repeatable)')
  a = p.parse_args(argv)
  stats = json.loads((pathlib.Path(a.mined) / 'stats.json').read_text())
  tau = stats['config']['tau']
  at = next(r for r in stats['per_tau'] if r['tau'] == tau)
  prec = at.get('precision')
  print(f"mined at τ = {tau}: {at['matches']} pairs, {at['clips']} clips from {at['videos']} "
        f"videos, {at['captions']} captions; precision "
        f"{'-' if prec is None else f'{100 * prec:.1f} %'}; skipped {stats['skipped']}")
  print('\nzero-shot on the held-out synthetic test split:')
  print(f"{'trained on':<16} {'step':>5} {'t2v R@1':>8} {'R@5':>6} {'R@10':>6} {'v2t R@1':>8} "
        f"{'R@5':>6} {'R@10':>6}")
  chance = oracle = None
  for spec in a.run:
    name, _, workdir = spec.rpartition(':')
    step, m = test_metrics(workdir)
    chance, oracle = m.get('test/chance_r1'), m.get('test/oracle_t2v_r1')
    print(f"{name:<16} {step:>5} {m['test/t2v_R@1']:>8.1f} {m['test/t2v_R@5']:>6.1f} "
          f"{m['test/t2v_R@10']:>6.1f} {m['test/v2t_R@1']:>8.1f} {m['test/v2t_R@5']:>6.1f} "
          f"{m['test/v2t_R@10']:>6.1f}")
  if chance is not None:
    print(f"chance R@1 {chance:.1f}; synthetic oracle t2v R@1 {oracle:.1f}")


if __name__ == '__main__':
  main()
