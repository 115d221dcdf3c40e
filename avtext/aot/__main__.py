r"""Compile a config for a TPU slice ahead of time, on any machine: does it fit, how fast can it go.

    python -m avtext.aot --config=configs/videocc_avr.py [--topology=v5e:4x4] [--json|--breakdown]
        [--plan [--examples=N] [--eval_examples=N]]

The config's real train step (the trainer's own jitted step, with the config's dtype,
remat, attention, micro-batches and partitioning) is lowered from abstract inputs at the
config's global batch (shapes from `Task.example_spec`: no data file is opened and no
weights are read) onto the devices of `--topology` (default `config.target_topology`),
which `jax.experimental.topologies` describes from libtpu alone (requirements-tpu.txt),
and compiled by the TPU compiler. Then, per chip

(per JAX device: a v5e chip is one device; libtpu describes a v4 or v5p chip as two,
each with half the chip's HBM and FLOP/s)

  HBM needed      arguments + outputs + temporaries - aliased (donated) buffers, from
                  the compiled program's memory analysis, against the chip's HBM
  bytes, FLOPs,   read from the compiled program itself (`avtext.aot.hlo_cost`): every
  interconnect    kernel it launches, weighted by its loops' trip counts (scanned layers
                  count N times), its HBM operands and outputs at their tiled size, the
                  FLOPs of its products (the Pallas flash kernels' from their shapes),
                  the bytes each collective sends (FSDP's all-gathers and
                  reduce-scatters, the gradient all-reduce)
  step bound      max(FLOPs / bf16 peak, bytes / HBM bandwidth, interconnect bytes /
                  ICI bandwidth) (`avtext.aot.cost_model`); the JSON's `bound_by`
                  names the term that binds: no step of this program can be faster
  MFU at bound    model FLOPs (the same step lowered without remat, before the
                  compiler) / (step bound x peak): the best utilization this program
                  allows; a real step is slower
  predicted step  the same kernels one after another, each at its own limit
                  (`avtext.aot.cost_model.predict`): max(its FLOPs / (peak x the matmul
                  unit's fill for each product's shapes x the achievable fraction), its
                  bytes / (HBM bandwidth x the achievable fraction)) + a launch per run,
                  a fused attention kernel's softmax on the special-function units;
                  collectives XLA made asynchronous hide behind the kernels around them.
                  The JSON's `predicted` has the step, MFU at it, the time by op class
                  and the 15 costliest kernels. The figures are public, one set per chip
                  (`avtext.aot.chips`); on the measured H100 steps the prediction is
                  at 0.77-0.95 of the measured step (`benchmarks.speed.paper_step_predicted`)
  breakdown       bytes, FLOPs, share of the bound and predicted time by op class
                  (matmuls/convs, attention kernels, elementwise/LayerNorm fusions,
                  copies/transposes, collectives, optimizer update), the 15 largest
                  kernels by bytes and the 15 costliest by predicted time:
                  `--breakdown`, and always in `--json`
  plan            (--plan) the whole schedule at the predicted step: train steps
                  (num_steps, or num_epochs x --examples / global batch), each
                  evaluator's passes at its predict functions' predicted time over
                  --eval_examples, wall time and chip-hours

  extrapolated    (--extrapolate) the same costs for the step with every layer unrolled,
                  from programs with one and two layers per stack compiled for the
                  slice: cost(L) = cost(1) + (L - 1) (cost(2) - cost(1)) per stack
                  and op class (`avtext.aot.programs.extrapolate`; MBT's unimodal and
                  fusion layers are two stacks). On a 4-layer AVR it is within 1.5 %
                  of the whole unrolled compile's FLOPs and bytes; the scanned
                  program (another program) moves up to 14 % more bytes
                  (`benchmarks.speed.aot_layers`, BENCHMARKS "Paper configs at scale")

Progress lines go to stderr while it works.
With --evals (default on) each predict function the evaluators call is compiled too, at
config.eval.batch_size, and must fit beside the parameters. `fits` is HBM needed <= the
chip's HBM; the paper configs keep >= 10 % headroom (tests/test_aot.py, BENCHMARKS.md).
The chip table (`avtext.aot.chips.CHIPS`) holds the public per-chip figures and their
sources; topology names are libtpu's ("v5e:4x4", "v4:2x2x4", "v5p:2x2x2", "v6e:2x2"), or
"h100:HOSTSxGPUS" for H100 SXM hosts ("h100:1x1", "h100:1x8"), which the CUDA PJRT plugin
of requirements-cuda12.txt describes from XLA's H100 target description (no GPU needed;
`make venv ACCEL=cuda12`, several GB, so not in the default venv). On a GPU target
attention "auto" is cuDNN's fused kernel.
"""
import json

from absl import flags
from absl import logging
from ml_collections import config_flags

from avtext import cli
from avtext import errors

FLAGS = flags.FlagValues()
_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "configs/<experiment>.py[:variant]; --config.<field>=<value> overrides",
    lock_config=True, flag_values=FLAGS)
_TOPOLOGY = flags.DEFINE_string(
    "topology", None, "TPU slice (v5e:4x4, v4:2x2x4) or GPU hosts (h100:1x1, h100:1x8; "
    "needs requirements-cuda12.txt) (default: config.target_topology)",
    flag_values=FLAGS)
_JSON = flags.DEFINE_bool("json", False, "print one JSON object instead of the report",
                          flag_values=FLAGS)
_EVALS = flags.DEFINE_bool("evals", True, "also compile the evaluators' predict functions",
                           flag_values=FLAGS)
_HLO_OUT = flags.DEFINE_string("hlo_out", None, "also write the compiled train step's "
                                "optimized HLO text here (to re-read its costs, or to "
                                "profile it)", flag_values=FLAGS)
_BREAKDOWN = flags.DEFINE_bool("breakdown", False, "print the step's costs by op class and "
                                "its 15 largest kernels (always in --json)",
                                flag_values=FLAGS)
_EXTRAPOLATE = flags.DEFINE_bool(
    "extrapolate", False, "also estimate the step with its layers unrolled from programs "
    "with 1 and 2 layers per stack (`extrapolated` in the JSON; a few small compiles)",
    flag_values=FLAGS)
_PLAN = flags.DEFINE_bool(
    "plan", False, "also print what the config's whole schedule costs on the slice: train "
    "steps x the predicted step, the evaluators' passes, wall time and chip-hours "
    "(`plan` in the JSON)", flag_values=FLAGS)
_EXAMPLES = flags.DEFINE_integer(
    "examples", None, "with --plan: training examples an epoch, for a config that counts "
    "epochs and gives no config.dataset.num_examples", flag_values=FLAGS)
_EVAL_EXAMPLES = flags.DEFINE_integer(
    "eval_examples", None, "with --plan: examples an evaluation pass runs its predict "
    "functions over (without it the passes are counted, not timed)", flag_values=FLAGS)
flags.mark_flag_as_required("config", flag_values=FLAGS)


def main(argv):
  if len(argv) > 1:
    raise errors.BadInput(f"unexpected arguments {list(argv[1:])}; see --help")
  config = cli.config_value(_CONFIG)
  logging.set_verbosity(logging.WARNING)
  # Imported here so --help answers without initializing JAX.
  from avtext import evals  # pylint: disable=g-import-not-at-top
  from avtext.tasks import task_registry  # pylint: disable=g-import-not-at-top
  from avtext.aot import programs as aot_lib  # pylint: disable=g-import-not-at-top
  from avtext.aot import report as report_lib  # pylint: disable=g-import-not-at-top
  try:
    report = aot_lib.analyze(
        config, _TOPOLOGY.value, build_task=task_registry.build_task,
        predict_fns=evals.predict_fn_names(config) if _EVALS.value else None,
        hlo_out=_HLO_OUT.value)
    if _EXTRAPOLATE.value:
      report["extrapolated"] = aot_lib.extrapolate(
          config, _TOPOLOGY.value, build_task=task_registry.build_task,
          model_flops_per_chip=report["model_flops_per_chip"])
    if _PLAN.value:
      report["plan"] = report_lib.plan(report, config, examples=_EXAMPLES.value,
                                       eval_examples=_EVAL_EXAMPLES.value)
  except (ValueError, RuntimeError) as e:
    raise errors.BadInput(str(e)) from None
  if _JSON.value:
    print(json.dumps(report, indent=2, sort_keys=True))
    return
  print(report_lib.format_report(report, breakdown=_BREAKDOWN.value))
  if _PLAN.value:
    print(report_lib.format_plan(report["plan"]))


if __name__ == "__main__":
  cli.run(main, FLAGS)
