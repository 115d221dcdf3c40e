"""Shared runner of the train-step benchmarks beside official PyTorch code.

Each side runs alone in its own process (no second framework's thread pool beside it):
`time_steps` in the child, `alternate` in the parent (official / avtext blocks until each
side has its timed steps, so load drifts hit both), `report` for the median / IQR table.
"""
import json
import platform
import subprocess
import time
from typing import Callable

import numpy as np


def add_timing_args(parser) -> None:
  """--steps, --warmup, --block, --seed and the hidden --side of the child processes."""
  parser.add_argument("--steps", type=int, default=10, help="timed steps per side")
  parser.add_argument("--warmup", type=int, default=2, help="untimed steps per process")
  parser.add_argument("--block", type=int, default=5, help="timed steps per process")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--side", choices=("official", "avtext"), help="(child processes)")


def time_steps(step: Callable[[], float], warmup: int, steps: int, info: dict) -> None:
  """Child: `warmup` untimed steps (the first compiles), `steps` timed; prints RESULT JSON."""
  losses = [step() for _ in range(warmup)]
  times = []
  for _ in range(steps):
    begin = time.perf_counter()
    losses.append(step())
    times.append(time.perf_counter() - begin)
  print("RESULT " + json.dumps({**info, "times": times, "losses": losses}), flush=True)


def cpu_float32(config) -> None:
  """The paper configs compute in bfloat16 on their TPU slices (`videocc_avr.paper_scale`);
  the official code here runs float32 on the CPU, and so does our side: float32 compute, no
  remat, materialized attention."""
  config.model.dtype, config.model.remat, config.model.attention = "float32", "none", "xla"


def avtext_step(config, task, batch: dict, steps_per_epoch: int):
  """(step() -> loss, number of params) of avtext's train step on one fixed `batch`: the
  step `make train` runs (`Trainer.make_train_step`: jitted, state donated), the state
  initialized as the trainer does, no data pipeline and no evaluator."""
  import jax  # pylint: disable=g-import-not-at-top
  from avtext.train import partitioning  # pylint: disable=g-import-not-at-top
  from avtext.train import trainer as trainer_lib  # pylint: disable=g-import-not-at-top
  # No evaluators run here; the trainer only checks the selection names one.
  trainer = trainer_lib.Trainer(config, "/tmp/bench_avtext_unused", task, evaluators={"val": None})
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


def cpu_name() -> str:
  """This machine's CPU model, for the report."""
  with open("/proc/cpuinfo") as f:
    return next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")),
                platform.processor())


def alternate(command: Callable[[str, int], list[str]], steps: int, block: int,
              sides=("official", "avtext")) -> dict[str, list[dict]]:
  """{side: [RESULT of each block]}; `command(side, n)` is the child's argv for n steps."""
  results = {side: [] for side in sides}
  for start in range(0, steps, block):
    for side in sides:
      out = subprocess.run(command(side, min(block, steps - start)), check=True,
                           capture_output=True, text=True).stdout
      results[side].append(json.loads(out.split("RESULT ", 1)[1]))
      print(f"{side}: {np.round(results[side][-1]['times'], 3).tolist()}", flush=True)
  return results


def report(results: dict[str, list[dict]], steps: int, block: int, warmup: int) -> None:
  """The losses of each side's first process, the step-time table and the ratio."""
  first = {side: r[0] for side, r in results.items()}
  print("loss on the repeated batch, step 1 -> step "
        f"{len(first['avtext']['losses'])}: " + "; ".join(
            f"{side} {r['losses'][0]:.4f} -> {r['losses'][-1]:.4f}" for side, r in first.items()))
  print("\n| implementation | step median (s) | IQR (s) |\n|---|---|---|")
  med = {}
  for name, r in results.items():
    q1, med[name], q3 = np.percentile(sum((x["times"] for x in r), []), [25, 50, 75])
    print(f"| {name} | {med[name]:.3f} | {q1:.3f}-{q3:.3f} |")
  print(f"\nspeed ratio official/avtext: {med['official'] / med['avtext']:.2f}x "
        f"(>1: avtext faster); {steps} timed steps per side, in alternating processes of "
        f"{block} after {warmup} untimed")



