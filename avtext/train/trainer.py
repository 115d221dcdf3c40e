"""The one training loop: init or resume, jitted sharded steps, checkpoints, evals.

    state = TrainState(step, params, model_state, opt_state, rng, control)
    for step in range(resumed_step, total_steps):
      batch = host_to_global(next(data_iterator))          # sharded on 'data'
      state, metrics = train_step(state, batch)             # jit, state donated
      before an evaluation or a save: the losses and the params' norm are finite
      evaluators due at this step -> results.json, TensorBoard, state.control
      checkpoint (best-N when config.eval.select improves, on disk first; latest-N)
    early stop or the last step: every evaluator has run at the final step

Everything task-specific comes from the task (`avtext.tasks.task_registry.Task`:
model, loss, data, predict functions) and the evaluators (`avtext.evals`,
declared in `config.evals`), both handed in by `avtext.experiment`: this package imports
nothing above it (`avtext.tasks`, `avtext.evals`). `config.eval.select`, reduce-on-plateau and early
stopping are in `control.py`; their counters are part of the checkpointed
state. Run state lives in `workdir`: re-running the same command resumes from
the latest checkpoint (params, non-param collections, optimizer state, step,
RNG, eval control and the input iterator's position), so a resumed run is
bit-identical to an uninterrupted one. Training holds the workdir's writer lock
and replaces its small files atomically (`avtext.atomic`).
"""
import contextlib
import math
import pathlib
import time
from typing import Any

from absl import logging
from clu import metric_writers
from clu import periodic_actions
import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from avtext import atomic
from avtext import errors
from avtext.train import checkpointing
from avtext.train import config_rules
from avtext.train import control as control_lib
from avtext.train import hosts
from avtext.train import nonfinite
from avtext.train.nonfinite import NonFiniteError
from avtext.train import optimizers
from avtext.train import partitioning
from avtext.train import results as results_lib
from avtext.train import rundir
from avtext.train import stop as stop_lib
from avtext.train import step as step_lib
from avtext.train.step import TrainState
from avtext.train import warm_start


class EvaluatorError(RuntimeError):
  """An evaluator raised; one line naming it, the step and the cause."""

  def __init__(self, name: str, step: int, cause: BaseException):
    text = " ".join(str(cause).split()) or type(cause).__name__
    super().__init__(f"evaluator {name!r} failed at step {step}: {type(cause).__name__}: "
                     f"{text[:300]}")
    self.__cause__ = cause
    self.step = step


def total_train_steps(config: ml_collections.ConfigDict, num_examples: int) -> tuple[int, int]:
  """(total steps, steps per epoch) from train.num_steps or train.num_epochs."""
  config_rules.check_count("train.batch_size", config.train.batch_size)
  config_rules.check_steps(config)
  steps_per_epoch = max(1, num_examples // config.train.batch_size)
  if config.train.get("num_steps") is not None:
    return int(config.train.num_steps), steps_per_epoch
  return int(math.ceil(config.train.num_epochs * steps_per_epoch)), steps_per_epoch


def _write_config(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> None:
  path = workdir / rundir.CONFIG_FILE
  text = config.to_json_best_effort(indent=2, sort_keys=True)
  if path.exists() and path.read_text() != text:
    logging.warning("%s differs from the current config; the run resumes with the "
                    "current config and the file is overwritten", path)
  if jax.process_index() == 0:
    atomic.write_text(path, text)


class Trainer:
  """Runs `task` as `config` says in `workdir`: `train()` or `evaluate()`.

  `evaluators`: {name: evaluator}, each with `run(variables, mesh=, step=)` -> metrics
  and optionally `skip_counts()` (`avtext.evals.base.Evaluator`); None stands in for
  one that is never run, e.g. when only compiling. `avtext.experiment` builds them from
  `config.evals`. `run_results` (`results.RunResults`) keeps the run's results.json.
  """

  def __init__(self, config: ml_collections.ConfigDict, workdir: str | pathlib.Path, task,
               evaluators: dict, devices=None):
    self.config = config
    self.workdir = pathlib.Path(workdir).absolute()
    # `devices`: default jax.devices(); avtext.aot passes a TPU topology's devices.
    self.mesh = partitioning.make_mesh(config.get("num_devices"),
                                       config.get("model_parallel", 1), devices=devices)
    self.task = task
    self.evaluators = evaluators
    self.select = control_lib.selection(config)
    config_rules.check_selected_evaluator(config, evaluators)
    # Training creates these (and the workdir); --mode=eval only reads checkpoints.
    self.checkpointer = self.best_checkpointer = None
    self._keep_results(self.workdir)
    self.total_steps = self.steps_per_epoch = None  # known once training opens its data

  # ---- state -------------------------------------------------------------

  def _data(self):
    local_batch = partitioning.per_process_batch_size(self.config.train.batch_size, self.mesh)
    dataset = self.task.train_data(
        batch_size=local_batch, seed=self.config.seed,
        process_index=jax.process_index(), process_count=jax.process_count())
    data = self.config.get("data", ml_collections.ConfigDict())
    read = grain.ReadOptions(num_threads=data.get("num_threads", 2),
                             prefetch_buffer_size=data.get("prefetch", 4))
    return dataset, iter(dataset.to_iter_dataset(read))

  def _variable_shardings(self, tree: Any) -> Any:
    """Params and non-param collections alike: `config.partitioning` (model rules,
    FSDP over `data`), else replicated."""
    part = self.config.get("partitioning") or {}
    return {k: partitioning.param_shardings(
        v, self.mesh, tuple(part.get("rules", ())), fsdp=bool(part.get("fsdp", False)),
        fsdp_min_size=part.get("fsdp_min_size") or partitioning.FSDP_MIN_SIZE)
            for k, v in tree.items()}

  def _optimizer(self):
    return optimizers.make_optimizer(self.config.optimizer, total_steps=self.total_steps,
                                     steps_per_epoch=self.steps_per_epoch)

  def _opt_state_sharding(self, tx, params, param_sharding):
    """Optimizer state sharded like the parameters it tracks (FSDP shards it too)."""
    trainable = optimizers.split_frozen(params, self.frozen)[0]
    abstract = jax.eval_shape(tx.init, trainable)
    return partitioning.follow_params(abstract, params, param_sharding, self.mesh)

  def abstract_state(self, batch) -> tuple[TrainState, Any, Any]:
    """(state of ShapeDtypeStructs with their shardings, tx, schedule) for a global
    `batch` of arrays or ShapeDtypeStructs: nothing is allocated, no weights are read
    (the shapes `avtext.aot` compiles the train step for)."""
    if self.total_steps is None:
      self.total_steps, self.steps_per_epoch = total_train_steps(self.config, 10 ** 6)
    rng = jax.ShapeDtypeStruct((2,), jnp.uint32)
    abstract = jax.eval_shape(self.task.init_variables, rng, batch)
    shardings = self._variable_shardings(abstract)
    variables = dict(jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings))
    params = variables.pop("params")
    self.frozen = optimizers.frozen_mask(params, tuple(self.config.optimizer.get("frozen") or ()))
    tx, schedule = self._optimizer()
    trainable = optimizers.split_frozen(params, self.frozen)[0]
    opt_sharding = self._opt_state_sharding(tx, params, shardings["params"])
    opt_state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                             jax.eval_shape(tx.init, trainable), opt_sharding)
    replicated = partitioning.replicated(self.mesh)
    scalar = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated)
    state = TrainState(step=scalar(jnp.zeros((), jnp.int32)), params=params,
                       model_state=variables, opt_state=opt_state,
                       rng=scalar(jax.random.PRNGKey(0)),
                       control=jax.tree.map(scalar, control_lib.init(self.config)))
    return state, tx, schedule

  def _init_state(self, example_batch, *, warm_start_params: bool = True
                  ) -> tuple[TrainState, Any]:
    rng = jax.random.PRNGKey(self.config.seed)
    init_rng, state_rng = jax.random.split(rng)
    batch = partitioning.host_to_global(example_batch, self.mesh)
    abstract = jax.eval_shape(self.task.init_variables, init_rng, batch)
    shardings = self._variable_shardings(abstract)
    variables = jax.jit(self.task.init_variables, out_shardings=shardings)(init_rng, batch)
    variables = dict(variables)
    params = self.task.load_pretrained(variables.pop("params"))
    if warm_start_params:
      params, variables = warm_start.apply_variables(params, variables, self.config)
      variables = jax.device_put(variables, {k: shardings[k] for k in variables})
    params = jax.device_put(params, shardings["params"])
    self.frozen = optimizers.frozen_mask(params, tuple(self.config.optimizer.get("frozen") or ()))
    tx, schedule = self._optimizer()
    replicated = partitioning.replicated(self.mesh)
    opt_state = jax.jit(tx.init, out_shardings=self._opt_state_sharding(
        tx, params, shardings["params"]))(optimizers.split_frozen(params, self.frozen)[0])
    state = TrainState(step=jax.device_put(jnp.zeros((), jnp.int32), replicated),
                       params=params, model_state=variables, opt_state=opt_state,
                       rng=jax.device_put(state_rng, replicated),
                       control=jax.device_put(control_lib.init(self.config), replicated))
    return state, (tx, schedule)

  def _state_sharding(self, state: TrainState) -> Any:
    return jax.tree.map(lambda x: x.sharding, state)

  # ---- steps -------------------------------------------------------------

  def _microbatches(self) -> int:
    """`config.train.microbatches` (k), checked: the global batch in k sequential parts."""
    k = config_rules.check_microbatches(self.config, partitioning.num_data_shards(self.mesh))
    if k == 1:
      return 1
    if self.task.encode is None or self.task.combine is None:
      raise ValueError(f"config.train.microbatches={k}: task {self.config.task!r} has no "
                       "encode/combine split (avtext/tasks/task_registry.py, Task.encode), so its "
                       "loss cannot run on micro-batches; use more devices or FSDP instead")
    return k


  @staticmethod
  def _variables(state: TrainState) -> dict:
    return step_lib.as_variables(state.params, state.model_state)

  def make_train_step(self, tx, schedule, state_sharding):
    """The jitted, donated train step of this run (`step.make_train_step`)."""
    return step_lib.make_train_step(
        self.task, self.config, self.mesh, frozen_mask=self.frozen, tx=tx, schedule=schedule,
        state_sharding=state_sharding, microbatches=self._microbatches())

  # ---- loop --------------------------------------------------------------

  def _open_checkpointers(self) -> None:
    config = self.config
    self.workdir.mkdir(parents=True, exist_ok=True)
    async_save = config.train.get("async_checkpointing", True)
    self.checkpointer = checkpointing.Checkpointer(
        self.workdir / checkpointing.LATEST_DIR, keep=config.train.get("keep_checkpoints", 3),
        async_save=async_save)
    if self.select:
      self.best_checkpointer = checkpointing.Checkpointer(
          self.workdir / checkpointing.BEST_DIR, keep=config.eval.get("keep_best", 1),
          async_save=async_save, best_mode=self.select[1])
      self._keep_results(self.workdir)

  def _keep_results(self, results_dir: pathlib.Path | None) -> None:
    """results.json and TensorBoard events go to `results_dir` (None: nowhere; see
    `evaluate`)."""
    self.run_results = results_lib.RunResults(
        workdir=self.workdir, results_dir=results_dir, select=self.select,
        best_checkpointer=self.best_checkpointer, evaluators=list(self.evaluators))

  def restore_or_init(self):
    """(state, optimizer pieces, data iterator); resumes from the newest intact
    checkpoint when there is one (a corrupt newer one is logged and deleted)."""
    if self.checkpointer is None:
      self._open_checkpointers()
    self.total_steps, self.steps_per_epoch = total_train_steps(
        self.config, self.task.num_train_examples())
    dataset, data_iter = self._data()
    resuming = self.checkpointer.latest_step() is not None
    # A resumed run restores its own params, so config.init_from is not read again.
    state, opt_pieces = self._init_state(dataset[0], warm_start_params=not resuming)
    if resuming:
      state, data_state, step = self.checkpointer.restore(state)
      if data_state:  # an imported checkpoint (avtext.import_checkpoint) has none
        data_iter.set_state(data_state)
      logging.info("resumed from %s at step %d", self.checkpointer.directory, step)
    self.run_results.reconcile_best()
    return state, opt_pieces, data_iter

  def _writer(self):
    results_dir = self.run_results.results_dir
    quiet = results_dir is None or jax.process_index() > 0
    return metric_writers.create_default_writer(
        None if quiet else str(results_dir), just_logging=quiet)

  def train(self) -> TrainState:
    """Trains (or resumes) to the end, holding the run's writer lock (`rundir.lock`).

    SIGINT / SIGTERM stop it at a step boundary (every process at the same one) with
    that step's checkpoint on disk (`stop.py`, errors.Interrupted); a lost process ends
    the others in one line (`hosts.py`); an evaluator that raises stops it with
    the step's checkpoint on disk (errors.EvaluationFailed), and a re-run evaluates it."""
    with (rundir.lock(self.workdir, process_index=jax.process_index()),
          stop_lib.StopRequest().catching() as stop):
      hosts.watch_checkpoints(lambda: self.checkpointer and self.checkpointer.last_on_disk())
      try:
        return self._train(stop)
      except (jax.errors.JaxRuntimeError, EvaluatorError) as e:
        hosts.lost(e.__cause__ or e)  # a lost process: its watchdog exits in one line
        if not isinstance(e, EvaluatorError):
          raise
        raise errors.EvaluationFailed(
            f"{e}; checkpoint {e.step} is on disk: fix it and re-run the same command, "
            "which evaluates that step again without training it again") from e

  def _train(self, stop: stop_lib.StopRequest) -> TrainState:
    config = self.config
    state, (tx, schedule), data_iter = self.restore_or_init()
    _write_config(config, self.workdir)
    start = int(state.step)
    writer = self._writer()
    if start == 0:
      writer.write_hparams(_flat_hparams(config))
    report = periodic_actions.ReportProgress(
        num_train_steps=self.total_steps, writer=writer, every_secs=None,
        every_steps=config.train.get("log_every_steps", 50))
    log_every = config.train.get("log_every_steps", 50)
    ckpt_every = config.train.get("checkpoint_every_steps", 500)
    periods = {name: ev.every(self.steps_per_epoch) for name, ev in self.evaluators.items()}

    def due_at(step):
      return [name for name, every in periods.items()
              if step == self.total_steps or (every and step % every == 0)]

    last_saved = self.checkpointer.latest_step()

    def evaluate(state, step, names, recorded=None):
      """`_evaluate`; on a failure, the step's checkpoint is on disk before it is raised."""
      try:
        return self._evaluate(state, step, writer, names, data_iter=data_iter,
                              recorded=recorded)
      except EvaluatorError:
        if last_saved != step:
          self.checkpointer.save(step, state, data_iter.get_state())
        self.checkpointer.wait()
        raise

    # The evaluations due at the step resumed from, if they did not finish (the
    # checkpoint is saved before them); the ones that did are replayed from results.json.
    state, caught_up = (state, []) if start == 0 else self._catch_up(
        state, start, due_at(start), evaluate)
    if bool(state.control.stopped) or start >= self.total_steps:
      logging.info("the run in %s is complete (step %d%s)", self.workdir, start,
                   ", early-stopped" if bool(state.control.stopped) else "")
      rest = [name for name in self.evaluators if name not in self.run_results.recorded(start)]
      if not caught_up and not rest:
        logging.info("evaluating step %d again", start)
        rest = list(self.evaluators)
      if rest:  # results only: the control counters are final and stay as saved
        self._run_or_fail(self._variables(state), start, writer, rest)
      writer.flush()
      return state
    logging.info("training steps %d -> %d on mesh %s (%d steps per epoch)",
                 start, self.total_steps, dict(self.mesh.shape), self.steps_per_epoch)
    train_step = self.make_train_step(tx, schedule, self._state_sharding(state))

    pending: list[tuple[int, dict]] = []  # metrics not yet checked on host
    params_norm = jax.jit(optax.global_norm)
    window_start, window_steps, window_sum = time.perf_counter(), 0, None
    step = start
    stop.at_boundary(step)  # a notice during the set-up stops before the first step
    finished = False  # every step trained and the last one's evaluations run
    try:
      while step < self.total_steps and not stop.requested:
        with (jax.profiler.StepTraceAnnotation("train", step_num=step),
              partitioning.mesh_context(self.mesh, config)):
          batch = partitioning.host_to_global(next(data_iter), self.mesh)
          state, metrics = train_step(state, batch)
        step += 1
        stop.at_boundary(step)
        window_steps += 1
        window_sum = metrics if window_sum is None else jax.tree.map(jnp.add, window_sum, metrics)
        pending.append((step, metrics))
        # Host checks lag one step so the device is never idle waiting for them.
        self._check_finite(pending[:-1], last_saved)
        del pending[:-1]
        report(step)
        if step % log_every == 0 or step == self.total_steps:
          self._check_finite(pending, last_saved)
          elapsed = time.perf_counter() - window_start
          # Means over the steps since the last log line; lr is the current one.
          scalars = {k: float(v) / window_steps for k, v in jax.device_get(window_sum).items()}
          scalars["lr"] = float(pending[-1][1]["lr"])
          scalars["examples_per_sec"] = window_steps * config.train.batch_size / elapsed
          scalars.update({f"train_skipped/{k}": v for k, v in self._train_skips().items()})
          writer.write_scalars(step, scalars)
          window_start, window_steps, window_sum = time.perf_counter(), 0, None
        due = due_at(step)
        save_due = step % ckpt_every == 0 or step == self.total_steps
        if due or save_due or stop.requested:
          # The params evaluated and saved here are the step's output, which its loss
          # (computed from the previous params) does not vouch for: a step can blow
          # them up to 1e29, finite, and NaN only at the next step.
          self._check_finite(pending, last_saved, params_norm=params_norm(state.params))
        if save_due or stop.requested:
          self.checkpointer.save(step, state, data_iter.get_state())
          last_saved = step
          if due:  # training is on disk before any evaluator runs
            self.checkpointer.wait()
        if due and not stop.requested:
          state = evaluate(state, step, due)
          finished = step == self.total_steps
        stopped = bool(state.control.stopped) if due else False
        if stopped and last_saved != step:
          self.checkpointer.save(step, state, data_iter.get_state())
          last_saved = step
        if stopped:
          logging.info("early stopping at step %d: %s did not improve for more than %d "
                       "evaluations", step, self.select[0],
                       config.eval.early_stopping_patience)
          # What the last step would have run: the evaluators not due now (those only
          # run at the end included), so a stopped run ends as its re-run does.
          rest = [name for name in self.evaluators if name not in due]
          if rest:
            self._run_or_fail(self._variables(state), step, writer, rest)
          break
      self._check_finite(pending, last_saved)
      if finished:  # a signal during the final evaluation: it completed, so has the run
        stop.note_finished()
      elif stop.requested:
        if last_saved != step and step > 0:
          self.checkpointer.save(step, state, data_iter.get_state())
          last_saved = step
        self.checkpointer.wait()
        kept = (f"checkpoint {step} kept; re-run to resume" if last_saved == step else
                "no checkpoint yet; re-run to start again")
        raise errors.Interrupted(f"interrupted at step {step}; {kept}", stop.exit_signal())
    finally:
      writer.flush()  # the steps logged so far, whatever stops the loop
      self.checkpointer.wait()
      if self.best_checkpointer is not None:
        self.best_checkpointer.wait()
    skips = self._train_skips()
    if skips and jax.process_index() == 0:
      logging.info("training data: %d examples; entries skipped by reason: %s",
                   self.task.num_train_examples(), skips)
      self.run_results.update(lambda r: r.update(train_data={
          "examples": self.task.num_train_examples(), "skipped": skips}))
    writer.flush()
    return state

  def _catch_up(self, state: TrainState, step: int, due: list[str], evaluate
                ) -> tuple[TrainState, list[str]]:
    """(state, the evaluators run now): the evaluations `due` at `step`, where training
    resumes. Each step's checkpoint is saved before they run, so its control counters
    do not include them yet: those recorded in results.json are replayed into them (the
    selected metric), the others are run now (`evaluate(state, step, names)`)."""
    if not due:
      return state, []
    recorded = self.run_results.recorded(step)
    missing = [name for name in due if name not in recorded]
    if missing:
      logging.info("step %d: evaluating %s, which did not finish before", step,
                   ", ".join(missing))
    return evaluate(state, step, due, recorded), missing

  def _check_finite(self, pending: list[tuple[int, dict]], last_saved: int | None, *,
                    params_norm: jax.Array | None = None) -> None:
    """Raises NonFiniteError at the first non-finite loss of `pending` ([(step, metrics)]),
    else if `params_norm`, the global norm of the params after pending's last step, is
    not finite (float32: it overflows once entries reach ~1e19, which no trained model
    has and which the next step turns into NaN)."""
    problem, at = next(((f"loss is {float(m['loss'])} at step {step}", step)
                        for step, m in pending if not np.isfinite(float(m["loss"]))),
                       (None, None))
    if problem is None and params_norm is not None and not np.isfinite(float(params_norm)):
      problem, at = (f"the parameters after step {pending[-1][0]} have a non-finite global "
                     f"norm ({float(params_norm)})"), pending[-1][0]
    if problem is None:
      return
    kept = (f"the last finite checkpoint, {self.checkpointer.step_dir(last_saved)}, is kept "
            "and re-running resumes from it" if last_saved is not None
            else "no checkpoint was written yet")
    raise NonFiniteError(f"{problem}; training stopped, {kept}. "
                         f"{nonfinite.advice(self.config, at)}")

  def _train_skips(self) -> dict[str, int]:
    """{reason: count} of the train split's entries put aside (files that are missing or
    do not decode, see `avtext.data.builders.media_clips`); {} for sources that skip nothing."""
    return self.task.train_skip_counts()

  def _evaluate(self, state: TrainState, step: int, writer, names: list[str], *,
                data_iter, recorded: dict | None = None) -> TrainState:
    """Runs the evaluators `names` during training, except those `recorded` ({name:
    metrics} already in results.json); the selected metric drives state.control (best
    checkpoint, plateau, early stopping)."""
    recorded = recorded or {}
    results = self._run_or_fail(self._variables(state), step, writer,
                                [name for name in names if name not in recorded])
    results.update({f"{name}/{metric}": value for name, metrics in recorded.items()
                    if name in names for metric, value in metrics.items()})
    if not self.select or self.select[0] not in results:
      return state
    key = self.select[0]
    control, events = control_lib.update(state.control, results[key], self.config)
    state = state.replace(control=jax.device_put(control, partitioning.replicated(self.mesh)))
    if events["reduced"]:
      logging.info("step %d: %s plateaued; learning-rate scale now %g", step, key,
                   float(control.lr_scale))
    if events["improved"] or self.config.eval.get("keep_best", 1) > 1:
      # With keep_best > 1 every evaluation is offered; orbax keeps the N best.
      self.best_checkpointer.save(step, state, data_iter.get_state(), metric=results[key])
      # On disk before the record below: results.json never names a best checkpoint
      # that is not there.
      self.best_checkpointer.wait()
    if events["improved"] and jax.process_index() == 0:
      self.run_results.update(lambda r: r.update(
          best={"metric": key, "step": step, "value": float(results[key])}))
    return state

  def _run_or_fail(self, variables, step: int, writer, names: list[str]) -> dict[str, Any]:
    """{"<evaluator>/<metric>": value} of the evaluators `names`, logged and saved. An
    evaluator that raises does not stop the others; the first failure is raised after
    them (EvaluatorError), the results of the others being saved."""
    flat: dict[str, Any] = {}
    failures = []
    for name in names:
      try:
        with ReportTime(f"eval {name}") as timer:
          results = self.evaluators[name].run(variables, mesh=self.mesh, step=step)
      except Exception as e:  # pylint: disable=broad-except
        logging.exception("evaluator %r failed at step %d", name, step)
        failures.append(EvaluatorError(name, step, e))
        continue
      results = {**results, "eval_seconds": timer.seconds}
      # The split's entries whose files were bad (builders.media_clips); evaluators that read
      # no files (the tests' stand-ins) need not have skip_counts.
      counts = getattr(self.evaluators[name], "skip_counts", lambda: None)()
      if counts is not None:
        results.update({f"skipped/{k}": v for k, v in counts.items()})
      flat.update({f"{name}/{k}": v for k, v in results.items()})
    if writer is not None:
      writer.write_scalars(step, {k: v for k, v in flat.items()
                                  if isinstance(v, (int, float)) and not isinstance(v, bool)})
    if flat and jax.process_index() == 0 and self.run_results.results_dir is not None:
      def add(all_results):
        all_results.setdefault(str(step), {}).update(flat)
        all_results["latest"] = {"step": step, **all_results[str(step)]}
      self.run_results.update(add)
    if failures:
      raise failures[0] from failures[0].__cause__
    return flat

  def evaluate(self, step: int | str | None = None,
               eval_dir: str | pathlib.Path | None = None) -> dict[str, Any]:
    """--mode=eval: every evaluator on checkpoint `step` (None: latest, "best", or N).

    Reads only the checkpoint and the evaluators' splits, never the train split, and
    needs neither the run's lock nor write access to read them. The results
    (results.json, TensorBoard events, the evaluators' exports) go to `eval_dir`, under
    its own writer lock; without one, into the run when this process can take the run's
    lock (the run is writable and nothing else writes it), else nowhere: the numbers
    are logged and one warning says why nothing was written.
    """
    try:
      saved, step = checkpointing.restore_raw(self.workdir, step)
    except FileNotFoundError as e:
      raise FileNotFoundError(f"--mode=eval: {self.workdir} holds no checkpoint to evaluate "
                              f"({e}); train first or fix --workdir") from e
    variables = {"params": saved["params"], **(saved.get("model_state") or {})}
    variables = jax.device_put(variables, self._variable_shardings(variables))
    out = pathlib.Path(eval_dir).absolute() if eval_dir else self.workdir
    with contextlib.ExitStack() as stack:
      try:
        stack.enter_context(rundir.lock(out, process_index=jax.process_index()))
      except (rundir.RunLockedError, OSError) as e:
        if eval_dir:
          raise
        logging.warning("--mode=eval writes nothing into %s (%s); pass --eval_dir=DIR to "
                        "keep the results and the evaluators' exports", self.workdir, e)
        out = None
      self._keep_results(out)
      for evaluator in self.evaluators.values():
        evaluator.workdir = out
      writer = self._writer()
      try:
        results = self._run_or_fail(variables, step, writer, list(self.evaluators))
      except EvaluatorError as e:
        raise errors.EvaluationFailed(f"{e}; the other evaluators' results are kept: fix it "
                                      "and re-run") from e
      writer.flush()
    return results


class ReportTime:
  """Context manager measuring wall seconds."""

  def __init__(self, name: str):
    self.name = name
    self.seconds = 0.0

  def __enter__(self):
    self._t0 = time.perf_counter()
    return self

  def __exit__(self, *exc):
    self.seconds = time.perf_counter() - self._t0
    logging.info("%s took %.1f s", self.name, self.seconds)


def _flat_hparams(config: ml_collections.ConfigDict) -> dict:
  flat = {}

  def walk(prefix, node):
    for key, value in node.items():
      name = f"{prefix}{key}"
      if isinstance(value, ml_collections.ConfigDict):
        walk(name + ".", value)
      elif isinstance(value, (int, float, str, bool)):
        flat[name] = value
  walk("", config)
  return flat
