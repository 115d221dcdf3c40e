"""Shared runner of the train-step benchmarks beside official PyTorch code.

Each side runs alone in its own process (no second framework's thread pool beside it):
`time_steps` in the child, `alternate` in the parent (official / avtext blocks until each
side has its timed steps, so load drifts hit both), `summary` for the median / IQR.
`define_flags()` gives a script --steps, --warmup, --block, --seed and the children's --side
and --check; `dispatch` runs a child's part.
"""
import json
import subprocess
import time
from typing import Callable

import numpy as np


def define_flags() -> None:
  from absl import flags  # pylint: disable=g-import-not-at-top
  flags.DEFINE_integer("steps", 10, "timed steps per side")
  flags.DEFINE_integer("warmup", 2, "untimed steps per process")
  flags.DEFINE_integer("block", 5, "timed steps per process")
  flags.DEFINE_integer("seed", 0, "seed of the batch")
  flags.DEFINE_enum("side", None, ["official", "avtext"], "(child processes)")
  flags.DEFINE_bool("check", False, "(child process) the same-weights step-1 losses")


def dispatch(flag, check: Callable[[], dict], side: Callable[[], None]):
  """A child process (--check: prints `check()` as RESULT JSON; --side: runs `side()`)
  returns None; the parent gets its (steps, block, warmup), (2, 1, 1) with --quick."""
  from benchmarks import common  # pylint: disable=g-import-not-at-top
  if flag.check:
    print("RESULT " + json.dumps(check()))
    return None
  if flag.side:
    side()
    return None
  return (2, 1, 1) if common.quick() else (flag.steps, flag.block, flag.warmup)


def time_steps(step: Callable[[], float], warmup: int, steps: int, info: dict) -> None:
  """Child: `warmup` untimed steps (the first compiles), `steps` timed; prints RESULT JSON."""
  losses = [step() for _ in range(warmup)]
  times = []
  for _ in range(steps):
    begin = time.perf_counter()
    losses.append(step())
    times.append(time.perf_counter() - begin)
  print("RESULT " + json.dumps({**info, "times": times, "losses": losses}), flush=True)


def result(argv: list[str]) -> dict:
  """The RESULT JSON a child process prints."""
  proc = subprocess.run(argv, capture_output=True, text=True, check=False)
  if proc.returncode or "RESULT " not in proc.stdout:
    raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
  return json.loads(proc.stdout.split("RESULT ", 1)[1])


def cpu_float32(config) -> None:
  """The paper configs compute in bfloat16 on their TPU slices (`videocc_avr.paper_scale`);
  the official code here runs float32 on the CPU, and so does our side: float32 compute, no
  remat, materialized attention."""
  config.model.dtype, config.model.remat, config.model.attention = "float32", "none", "xla"


def avtext_step(config, task, batch: dict, steps_per_epoch: int):
  """(step() -> loss, number of params) of avtext's train step on one fixed `batch`: the
  step `make train` runs (`Trainer.make_train_step`: jitted, state donated), the state
  initialized as the trainer does, no data pipeline and no evaluator."""
  import tempfile  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from avtext.train import partitioning  # pylint: disable=g-import-not-at-top
  from avtext.train import trainer as trainer_lib  # pylint: disable=g-import-not-at-top
  # No evaluators run here; the trainer only checks the selection names one.
  trainer = trainer_lib.Trainer(config, tempfile.mkdtemp(prefix="bench_avtext_"), task,
                                evaluators={"val": None})
  trainer.steps_per_epoch = steps_per_epoch
  trainer.total_steps = steps_per_epoch * config.train.num_epochs
  state, (tx, schedule) = trainer._init_state(batch)  # pylint: disable=protected-access
  train_step = trainer.make_train_step(
      tx, schedule, trainer._state_sharding(state))  # pylint: disable=protected-access
  batch = partitioning.host_to_global(batch, trainer.mesh)
  holder = {"state": state}

  def step() -> float:
    holder["state"], metrics = train_step(holder["state"], batch)
    return float(metrics["loss"])  # blocks until the step is done

  return step, sum(x.size for x in jax.tree.leaves(state.params))


def alternate(command: Callable[[str, int], list[str]], steps: int, block: int,
              sides=("official", "avtext")) -> dict[str, list[dict]]:
  """{side: [RESULT of each block]}; `command(side, n)` is the child's argv for n steps."""
  results = {side: [] for side in sides}
  for start in range(0, steps, block):
    for side in sides:
      results[side].append(result(command(side, min(block, steps - start))))
      print(f"{side}: {np.round(results[side][-1]['times'], 3).tolist()}", flush=True)
  return results


def summary(results: dict[str, list[dict]], steps: int, block: int, warmup: int) -> dict:
  """Prints the losses of each side's first process and the step-time table;
  {side: (median, q1, q3)} in seconds."""
  first = {side: r[0] for side, r in results.items()}
  print("loss on the repeated batch, step 1 -> step "
        f"{len(first['avtext']['losses'])}: " + "; ".join(
            f"{side} {r['losses'][0]:.4f} -> {r['losses'][-1]:.4f}" for side, r in first.items()))
  print("\n| implementation | step median (s) | IQR (s) |\n|---|---|---|")
  out = {}
  for name, r in results.items():
    q1, median, q3 = np.percentile(sum((x["times"] for x in r), []), [25, 50, 75])
    out[name] = (float(median), float(q1), float(q3))
    print(f"| {name} | {median:.3f} | {q1:.3f}-{q3:.3f} |")
  print(f"\nspeed ratio official/avtext: {out['official'][0] / out['avtext'][0]:.2f}x "
        f"(>1: avtext faster); {steps} timed steps per side, in alternating processes of "
        f"{block} after {warmup} untimed")
  return out


def record_summary(system: str, table: str, timing: dict, peer_name: str) -> None:
  """The step-time rows of `summary`: median and IQR per side, the ratio as the headline."""
  from benchmarks import common  # pylint: disable=g-import-not-at-top
  for side, (median, q1, q3) in timing.items():
    name = peer_name if side == "official" else "avtext (JAX)"
    common.record(system, name, median, unit="s", table=table, column="step median",
                  digits=4)
    common.record(system, name, f"{q1:.3f}-{q3:.3f}", unit="s", table=table, column="IQR")
  common.record(system, f"train step: {peer_name} time / avtext time",
                timing["official"][0] / timing["avtext"][0], unit="x", table=table,
                column="ratio", headline="speed", digits=3)
