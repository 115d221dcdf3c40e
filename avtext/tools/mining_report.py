r"""Print a mining run's statistics beside zero-shot retrieval of AVR runs trained on what
it mined and on ground truth (`make demo-mining`):

    python -m avtext.tools.mining_report --mined=DIR --workdir=mined=RUN_DIR \
        --workdir="ground truth=RUN_DIR"
"""
import json
import pathlib

from absl import flags

from avtext import cli
from avtext import errors

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


FLAGS = flags.FlagValues()
_MINED = cli.DEFINE_path("mined", None, "the --out directory of python -m avtext.mine",
                         flag_values=FLAGS)
_WORKDIRS = flags.DEFINE_multi_string("workdir", [], "LABEL=RUN_DIR: an AVR run to report "
                                      "(repeatable)", flag_values=FLAGS)
flags.mark_flag_as_required("mined", flag_values=FLAGS)


def main(argv):
  if len(argv) > 1:
    raise errors.BadInput(f"unexpected arguments {list(argv[1:])}; see --help")
  runs = []
  for spec in _WORKDIRS.value:
    name, sep, workdir = spec.partition("=")
    if not sep or not workdir:
      raise errors.BadInput(f"--workdir={spec}: expected LABEL=RUN_DIR")
    runs.append((name, cli.expand(workdir)))
  stats_file = pathlib.Path(_MINED.value) / 'stats.json'
  if not stats_file.exists():
    raise errors.InputNotFound(f'--mined={_MINED.value}: no stats.json; run python -m '
                               'avtext.mine first')
  stats = json.loads(stats_file.read_text())
  tau = stats['config']['tau']
  at = next(r for r in stats['per_tau'] if r['tau'] == tau)
  prec = at.get('precision')
  print(f"mined at τ = {tau}: {at['matches']} pairs, {at['clips']} clips from {at['videos']} "
        f"videos, {at['captions']} captions; precision "
        f"{'-' if prec is None else f'{100 * prec:.1f} %'}; skipped {stats['skipped']}")
  print('\nzero-shot on the held-out test split:')
  print(f"{'trained on':<16} {'step':>5} {'t2v R@1':>8} {'R@5':>6} {'R@10':>6} {'v2t R@1':>8} "
        f"{'R@5':>6} {'R@10':>6}")
  chance = oracle = None
  for name, workdir in runs:
    step, m = test_metrics(workdir)
    chance, oracle = m.get('test/chance_r1'), m.get('test/oracle_t2v_r1')
    print(f"{name:<16} {step:>5} {m['test/t2v_R@1']:>8.1f} {m['test/t2v_R@5']:>6.1f} "
          f"{m['test/t2v_R@10']:>6.1f} {m['test/v2t_R@1']:>8.1f} {m['test/v2t_R@5']:>6.1f} "
          f"{m['test/v2t_R@10']:>6.1f}")
  if chance is not None:
    print(f"chance R@1 {chance:.1f}; oracle t2v R@1 {oracle:.1f}")


if __name__ == '__main__':
  cli.run(main, FLAGS)
