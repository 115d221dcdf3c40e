"""Entry point: python -m avtext.main --config=configs/<x>.py[:variant] --workdir=DIR

    --config.key=value   overrides any config field
    --mode=train|eval    eval: run every config.evals entry on a checkpoint of --workdir
    --step=N|best        with --mode=eval: which checkpoint (default: the latest)
    --distributed        multi-host: initialize jax.distributed (see launch/)

Re-running the same command resumes from the latest checkpoint in --workdir.
"""
import logging as py_logging

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "configs/<experiment>.py[:variant]", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (checkpoints, metrics, results)")
_MODE = flags.DEFINE_enum("mode", "train", ["train", "eval"], "what to run")
_STEP = flags.DEFINE_string("step", None, "--mode=eval: checkpoint step N or 'best' "
                            "(default: latest)")
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed", False, "call jax.distributed.initialize() first (multi-host TPU/GPU)")
# Without these, jax.distributed reads the cluster environment (TPU VM, SLURM, Open MPI).
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "--distributed: host:port of process 0's coordinator")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "--distributed: process count")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "--distributed: this process, 0-based")
_LOCAL_DEVICES = flags.DEFINE_list(
    "local_device_ids", None, "--distributed: local accelerator ids this process drives "
    "(e.g. 0 when the scheduler shows each process a single GPU)")
flags.mark_flags_as_required(["config", "workdir"])


class _QuietLibraries(py_logging.Filter):
  """Drops INFO chatter of checkpointing internals; warnings still pass."""

  def filter(self, record):
    return record.levelno >= py_logging.WARNING or "/orbax/" not in record.pathname


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  # Imported here so --help answers without initializing JAX.
  import jax  # pylint: disable=g-import-not-at-top
  from avtext.tasks import registry  # pylint: disable=g-import-not-at-top
  from avtext.train import trainer  # pylint: disable=g-import-not-at-top
  cluster_flags = (_COORDINATOR, _NUM_PROCESSES, _PROCESS_ID, _LOCAL_DEVICES)
  if _DISTRIBUTED.value:
    # Cross-process collectives on the CPU backend (fake-device tests, CPU
    # clusters); accelerator backends ignore this setting.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # Flags left unset (None) are read from the cluster environment.
    jax.distributed.initialize(
        coordinator_address=_COORDINATOR.value, num_processes=_NUM_PROCESSES.value,
        process_id=_PROCESS_ID.value,
        local_device_ids=None if _LOCAL_DEVICES.value is None else
        [int(i) for i in _LOCAL_DEVICES.value])
  elif any(f.present for f in cluster_flags):
    raise app.UsageError("--coordinator_address/--num_processes/--process_id/"
                         "--local_device_ids need --distributed")
  logging.set_verbosity(logging.INFO)
  logging.get_absl_handler().addFilter(_QuietLibraries())
  if _STEP.value is not None and _MODE.value != "eval":
    raise app.UsageError("--step goes with --mode=eval")
  config = _CONFIG.value
  run = trainer.Trainer(config, _WORKDIR.value, registry.build_task(config))
  if _MODE.value == "train":
    run.train()
  else:
    run.evaluate(_STEP.value)


if __name__ == "__main__":
  app.run(main)
