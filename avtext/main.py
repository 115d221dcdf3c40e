"""Entry point: python -m avtext.main --config=configs/<x>.py[:variant] --workdir=DIR

    --config.key=value   overrides any config field
    --mode=train|eval    eval: run every config.evals entry on a checkpoint of --workdir
    --step=N|best        with --mode=eval: which checkpoint (default: the latest)
    --eval_dir=DIR       with --mode=eval: where its results and exports go (default:
                         the run itself when nothing else writes it and it is writable,
                         else nowhere: the numbers are only logged)
    --distributed        multi-host: initialize jax.distributed (see launch/)
    --allow_cpu          train a config with a config.target_topology (a TPU slice
                         such as v5e:4x4) even when JAX finds only CPU devices
    --require_backend=tpu|gpu  exit at once unless JAX runs on it (launch/ scripts)

Re-running the same command resumes from the latest checkpoint in --workdir.
One process trains a workdir at a time (avtext/train/rundir.py): a second launch on
it exits at once with one line naming the running one.
"""
import importlib.util
import os
import pathlib
import re
import shutil
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from avtext import cli
from avtext import errors

FLAGS = flags.FlagValues()
_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "configs/<experiment>.py[:variant]; --config.<field>=<value> overrides "
    "a field. With --mode=eval it may be left out: the run's own config.json is used",
    lock_config=True, flag_values=FLAGS)
_WORKDIR = cli.DEFINE_path("workdir", None, "run directory (checkpoints, metrics, results); "
                           "its config.json is the run's identity", flag_values=FLAGS)
_MODE = flags.DEFINE_enum("mode", "train", ["train", "eval"], "what to run", flag_values=FLAGS)
_STEP = cli.DEFINE_checkpoint_step(FLAGS, "--mode=eval: checkpoint step N or 'best' "
                                   "(default: latest)")
_EVAL_DIR = cli.DEFINE_path(
    "eval_dir", None, "--mode=eval: directory for results.json, TensorBoard events and "
    "the evaluators' exports (default: the run, when it is writable and not in use)",
        flag_values=FLAGS)
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed", False, "call jax.distributed.initialize() first (multi-host TPU/GPU)",
        flag_values=FLAGS)
# Without these, jax.distributed reads the cluster environment (TPU VM, SLURM, Open MPI).
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "--distributed: host:port of process 0's coordinator",
        flag_values=FLAGS)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "--distributed: process count",
    flag_values=FLAGS)
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "--distributed: this process, 0-based",
    flag_values=FLAGS)
_LOCAL_DEVICES = flags.DEFINE_list(
    "local_device_ids", None, "--distributed: local accelerator ids this process drives "
    "(e.g. 0 when the scheduler shows each process a single GPU)", flag_values=FLAGS)
_HEARTBEAT = flags.DEFINE_integer(
    "heartbeat_timeout_seconds", None, "--distributed: a process silent this long is lost "
    "(the others then exit in one line naming it; default: JAX's, 100)", lower_bound=1,
    flag_values=FLAGS)
_ALLOW_CPU = flags.DEFINE_bool(
    "allow_cpu", False, "--mode=train a config that targets an accelerator "
    "(config.target_topology) even when JAX finds only CPU devices", flag_values=FLAGS)
_REQUIRE_BACKEND = flags.DEFINE_enum(
    "require_backend", None, ["tpu", "gpu"], "exit at once unless jax.default_backend() "
    "is this (launch/ scripts pass it, so a missing runtime or device is no CPU run)",
        flag_values=FLAGS)
flags.mark_flags_as_required(["workdir"], flag_values=FLAGS)


def _quiet_closed_loops(hook):
  """`hook` (sys.unraisablehook) less "RuntimeError: Event loop is closed".

  After a failed save, tensorstore reports every array write that completes after
  orbax closed the save's event loop with a traceback of its own (thousands of lines
  on a full disk), while the failure itself is reported once (CheckpointSaveError).
  """

  def unraisablehook(unraisable):
    value = unraisable.exc_value
    if not (isinstance(value, RuntimeError) and str(value) == "Event loop is closed"):
      hook(unraisable)
  return unraisablehook


def _log_platform(jax) -> None:
  """One line: the backend, its devices and the processes sharing them."""
  devices = jax.devices()
  logging.info("JAX %s on %s: %d devices (%d on this process), kind %s; process %d of %d",
               jax.__version__, jax.default_backend(), len(devices),
               jax.local_device_count(), ", ".join(sorted({d.device_kind for d in devices})),
               jax.process_index(), jax.process_count())


def _why_cpu() -> str:
  """Why JAX's default backend is the CPU, as far as this process can tell."""
  forced = os.environ.get("JAX_PLATFORMS")
  if forced and not os.environ.get(cli.AUTO_PLATFORMS_ENV):
    return f"JAX_PLATFORMS={forced}"
  runtimes = {  # installed accelerator runtime -> the devices it drives
      name: device for name, module, device in (
          ("libtpu", "libtpu", "TPU"), ("jax-cuda12-plugin", "jax_cuda12_plugin", "GPU"))
      if importlib.util.find_spec(module) is not None}
  if runtimes:
    return (f"{' and '.join(runtimes)} installed but no "
            f"{' or '.join(runtimes.values())} found here")
  return "jaxlib without an accelerator runtime"


def _check_backend(config, backend: str) -> None:
  """Exits with one line when the devices JAX found cannot be what the run needs.

  --require_backend names the backend outright. Otherwise a paper config names its
  slice in config.target_topology ("v5e:4x4"; demo and tiny variants leave it None):
  without an accelerator runtime (or with JAX_PLATFORMS=cpu) JAX falls back to the
  CPU, where such a run would take months, so training it there needs --allow_cpu.
  errors.UserError: one line on stderr, exit status 2 (`avtext.cli.run`).
  """
  if _REQUIRE_BACKEND.value and backend != _REQUIRE_BACKEND.value:
    why = f" ({_why_cpu()})" if backend == "cpu" else ""
    raise errors.UserError(
        f"--require_backend={_REQUIRE_BACKEND.value} but JAX runs on {backend}{why}; "
        f"install the runtime (make venv ACCEL=tpu|cuda12, docs/scale.md 'Run on a TPU pod' / "
        f"'Run on GPUs') and check the devices are visible (nvidia-smi; TPU VM)")
  topology = config.get("target_topology")
  if not topology or backend != "cpu" or _MODE.value != "train":
    return
  target = f"TPU {topology}" if re.match(r"v\d", str(topology)) else str(topology)
  source = config_flags.get_config_filename(FLAGS["config"])
  if _ALLOW_CPU.value:
    logging.warning("%s targets %s (config.target_topology); training on CPU devices "
                    "anyway (--allow_cpu)", source, target)
    return
  raise errors.UserError(
      f"{source} targets {target} (config.target_topology) but JAX finds only CPU "
      f"devices ({_why_cpu()}); on the accelerator machine install its runtime (make venv "
      f"ACCEL=tpu|cuda12, docs/scale.md 'Run on a TPU pod' / 'Run on GPUs'), or pass "
      f"--allow_cpu to train at paper scale on the CPU anyway, or pick the :demo variant")


def _config_or_error():
  """--config loaded (overrides applied), or one UserError naming the file or field."""
  source = config_flags.get_config_filename(FLAGS["config"])
  cli.check_config_file("config", source)
  try:
    config = _CONFIG.value
  except Exception as e:  # pylint: disable=broad-except
    raise errors.BadInput(f"--config={source}: {cli.exception_message(e)}") from e
  return cli.expand_config_paths(config)


def _eval_config(workdir: str):
  """--mode=eval without --config: the run's own config.json."""
  from avtext import runs  # pylint: disable=g-import-not-at-top
  try:
    return runs.load_config(workdir)
  except FileNotFoundError:
    raise errors.InputNotFound(
        f"--mode=eval: {workdir} is not an avtext run (no config.json there); train it "
        f"first, fix --workdir, or pass --config") from None


def _config_errors(build, config):
  """build(config); a ValueError it raises about a config field ("config.<field>...",
  the convention of every check that reads one) becomes one line naming the flag."""
  try:
    return build(config)
  except ValueError as e:
    text = cli.exception_message(e)
    if not text.startswith("config."):
      raise
    raise errors.BadInput(f"--{text}") from e


def _remove_if_unused(workdir: pathlib.Path) -> None:
  """Removes a run directory this command created when it saved no checkpoint there."""
  from avtext.train import checkpointing  # pylint: disable=g-import-not-at-top
  for name in (checkpointing.LATEST_DIR, checkpointing.BEST_DIR):
    folder = workdir / name
    if folder.is_dir() and any(p.name.isdigit() for p in folder.iterdir()):
      return
  shutil.rmtree(workdir, ignore_errors=True)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  for flag in (_STEP, _EVAL_DIR):
    if flag.value is not None and _MODE.value != "eval":
      raise app.UsageError(f"--{flag.name} goes with --mode=eval")
  cluster_flags = (_COORDINATOR, _NUM_PROCESSES, _PROCESS_ID, _LOCAL_DEVICES, _HEARTBEAT)
  if not _DISTRIBUTED.value and any(f.present for f in cluster_flags):
    raise app.UsageError("--coordinator_address/--num_processes/--process_id/"
                         "--local_device_ids/--heartbeat_timeout_seconds need --distributed")
  workdir = _WORKDIR.value
  if _MODE.value == "train":  # a file, or a place no directory can be made: before any work
    cli.check_output_dir("workdir", workdir)
  if _EVAL_DIR.value:
    cli.check_output_dir("eval_dir", _EVAL_DIR.value)
  from avtext.train import rundir  # pylint: disable=g-import-not-at-top
  if _MODE.value == "train":
    try:  # first, so a second launch on a running workdir exits in seconds
      rundir.check_free(workdir)
    except rundir.RunLockedError as e:
      raise errors.WorkdirInUse(str(e)) from None
  # Every input is checked before anything is written.
  if FLAGS["config"].present:
    config = _config_or_error()
  elif _MODE.value == "eval":
    config = _eval_config(workdir)
  else:
    raise errors.BadInput("--config is required to train (configs/<experiment>.py[:variant]); "
                          "see python -m avtext.main --help")
  source = (f"--config={config_flags.get_config_filename(FLAGS['config'])}"
            if FLAGS["config"].present else "this command")
  rundir.check_workdir(config, workdir, source=source)
  from avtext import experiment  # pylint: disable=g-import-not-at-top
  experiment.check_config(config, None)  # values and names: the batch once JAX counts devices
  # Imported here so --help answers without initializing JAX.
  import jax  # pylint: disable=g-import-not-at-top
  if _DISTRIBUTED.value:
    from avtext.train import hosts  # pylint: disable=g-import-not-at-top
    hosts.initialize(  # flags left unset (None) are read from the cluster environment
        coordinator_address=_COORDINATOR.value, num_processes=_NUM_PROCESSES.value,
        process_id=_PROCESS_ID.value,
        local_device_ids=None if _LOCAL_DEVICES.value is None else
        [int(i) for i in _LOCAL_DEVICES.value],
        heartbeat_timeout_s=_HEARTBEAT.value)
  cli.log_progress()
  sys.unraisablehook = _quiet_closed_loops(sys.unraisablehook)
  _log_platform(jax)
  _check_backend(config, jax.default_backend())
  if _MODE.value == "eval" and not rundir.has_checkpoint(workdir):
    # before the model is built: the trainer's restore says the same, a minute later
    raise errors.BadInput(f"--mode=eval: {workdir} holds no checkpoint to evaluate; train "
                          "first or fix --workdir")
  if _MODE.value == "eval" and _STEP.value == "best" and (
      why := rundir.no_best_reason(workdir, config)):
    raise errors.BadInput(f"--step=best: {workdir} holds no best checkpoint: {why}; evaluate "
                          "the latest (leave --step out) or a step (--step=N)")
  # Every value, then the run's files (weights, vocabularies, dataset paths), before the
  # data is probed.
  experiment.check_config(config, jax.device_count())  # before the task's libraries load
  from avtext.tasks import task_registry  # pylint: disable=g-import-not-at-top
  task = _config_errors(task_registry.build_task, config)
  experiment.check_inputs(config, task)
  from avtext.train import checkpointing  # pylint: disable=g-import-not-at-top
  if _MODE.value == "train":
    _config_errors(lambda _: task.train_source, config)
    # ^ opens (and checks) the training data before the workdir is created
  workdir_path = pathlib.Path(workdir).absolute()
  from avtext import evals  # pylint: disable=g-import-not-at-top
  evaluators = _config_errors(lambda c: evals.build_evaluators(c, task, workdir_path), config)
  if _MODE.value == "train":  # every split's files, and a selection metric they can give
    evals.check_splits(config, evaluators)
  created = _MODE.value == "train" and not workdir_path.exists()
  try:
    # The trainer takes the workdir's lock first thing (`Trainer.train`), so a second
    # launch exits in seconds; --mode=eval takes it only to write into the run
    # (`Trainer.evaluate`).
    run = experiment.build(config, workdir, task=task, evaluators=evaluators)
    if _MODE.value == "train":
      state = run.train()
      done = f"trained {workdir} to step {int(state.step)}: checkpoints in " \
             f"{workdir_path / rundir.LATEST_DIR}"
    else:
      run.evaluate(_STEP.value, eval_dir=_EVAL_DIR.value)
      done = f"evaluated {workdir}"
    results = run.run_results.path
    if jax.process_index() == 0:  # the one line saying where the results are
      print(f"{done}; results in {results}" if results and results.exists()
            else f"{done}; no results written (no evaluator ran, or see the warning above)")
  except rundir.RunLockedError as e:
    raise errors.WorkdirInUse(str(e)) from None  # one line, as the messages are
  except checkpointing.CheckpointSaveError as e:  # e.g. a full disk: what to do is known
    raise errors.UserError(str(e)) from None
  except BaseException:
    if created and jax.process_index() == 0:
      _remove_if_unused(workdir_path)
    raise


if __name__ == "__main__":
  cli.run(main, FLAGS)
