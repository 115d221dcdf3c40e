"""Faults a run directory survives: a blow-up, a kill at an eval-only step, corrupt
checkpoints. Tiny AVR runs without the retrieval evaluator (a stand-in scores steps)."""
import json
import logging
import os
import re
import shutil

import jax
import numpy as np
import pytest

from avtext import experiment
from avtext import runs
from avtext.train import checkpointing
from avtext.train import trainer as trainer_lib
from tests.test_train_trainer import tiny_config


def _trainer(config, workdir, evaluators=None):
  return experiment.build(config, workdir, evaluators=evaluators or {})


def _steps(directory):
  return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def _norm(tree):
  return np.sqrt(sum(np.sum(np.square(np.asarray(x, np.float64))) for x in jax.tree.leaves(tree)))


def _warnings(caplog, text):
  return [r.getMessage() for r in caplog.records
          if r.levelno >= logging.WARNING and text in r.getMessage()]


@pytest.fixture(scope="module")
def recovered_run(tmp_path_factory):
  """lr 1e30, a checkpoint every step: the run stops; re-run with the config's lr to 6."""
  workdir = tmp_path_factory.mktemp("recovered")
  blowup = tiny_config(**{"optimizer.learning_rate": 1e30, "train.checkpoint_every_steps": 1,
                          "train.keep_checkpoints": 10, "train.num_steps": 6})
  with pytest.raises(trainer_lib.NonFiniteError) as stopped:
    _trainer(blowup, workdir).train()
  kept = _steps(workdir / "checkpoints")
  kept_state = {s: checkpointing.restore_raw(workdir, s)[0] for s in kept}
  sane = tiny_config(**{"train.checkpoint_every_steps": 1, "train.keep_checkpoints": 10,
                        "train.num_steps": 6})
  state = _trainer(sane, workdir).train()
  return workdir, str(stopped.value), kept, kept_state, state


def test_blown_up_params_are_never_checkpointed_and_the_rerun_finishes(recovered_run):
  workdir, message, kept, kept_state, state = recovered_run
  # Warmup: step 1 moves nothing, step 2 moves every weight by ~1e29 (finite, but its
  # norm overflows); step 3's loss would be NaN. Step 2 is not saved.
  assert kept == [1]
  assert ("the parameters after step 2 have a non-finite global norm (inf); training "
          f"stopped, the last finite checkpoint, {workdir}/checkpoints/1, is kept") in message
  assert np.isfinite(_norm(kept_state[1]["params"]))
  assert int(state.step) == 6
  assert _steps(workdir / "checkpoints") == [1, 2, 3, 4, 5, 6]
  assert np.isfinite(_norm(state.params))


# ---------------------------------------------------------------- best at eval-only steps


class _StepScore:
  """An evaluator every step whose score is the step: every evaluation is a new best."""

  def every(self, steps_per_epoch):
    del steps_per_epoch
    return 1

  def run(self, variables, *, mesh, step):
    del variables, mesh
    return {"score": float(step)}


class _Killed(Exception):
  pass


def test_best_record_is_on_disk_at_an_eval_only_step(tmp_path, monkeypatch):
  """A best save that takes forever (it lands only when waited for) and a kill right
  after step 3's evaluation (no regular checkpoint at 3): what is on disk then must agree."""
  config = tiny_config(**{"train.num_steps": 4, "train.checkpoint_every_steps": 2,
                          "eval.select": ("score/score", "max")})
  real_save, real_wait = checkpointing.Checkpointer.save, checkpointing.Checkpointer.wait
  deferred = []

  def slow_save(self, step, state, *args, **kwargs):
    if self.directory.name != checkpointing.BEST_DIR:
      return real_save(self, step, state, *args, **kwargs)
    copy = jax.tree.map(lambda x: x.copy(), state)  # the train step donates `state`
    deferred.append(lambda: real_save(self, step, copy, *args, **kwargs))
    return True

  def slow_wait(self):
    while deferred:
      deferred.pop(0)()
    real_wait(self)

  real_evaluate = trainer_lib.Trainer._evaluate  # pylint: disable=protected-access
  killed = tmp_path / "killed"

  def evaluate_then_kill(self, state, step, *args, **kwargs):
    state = real_evaluate(self, state, step, *args, **kwargs)
    if step == 3:
      shutil.copytree(self.workdir, killed)  # what SIGKILL here leaves on disk
      raise _Killed
    return state

  monkeypatch.setattr(checkpointing.Checkpointer, "save", slow_save)
  monkeypatch.setattr(checkpointing.Checkpointer, "wait", slow_wait)
  monkeypatch.setattr(trainer_lib.Trainer, "_evaluate", evaluate_then_kill)
  with pytest.raises(_Killed):
    _trainer(config, tmp_path / "run", {"score": _StepScore()}).train()
  monkeypatch.undo()

  results = json.loads((killed / "results.json").read_text())
  assert results["best"] == {"metric": "score/score", "step": 3, "value": 3.0}
  assert _steps(killed / "best_checkpoints") == [3]
  assert _steps(killed / "checkpoints") == [2]
  assert runs.load_run(killed, step="best").step == 3

  # A kill between the best save and its record leaves the record on a pruned step;
  # the resumed run takes the best on disk.
  results["best"] = {"metric": "score/score", "step": 2, "value": 2.0}
  (killed / "results.json").write_text(json.dumps(results))
  _trainer(config, killed, {"score": _StepScore()}).restore_or_init()
  assert json.loads((killed / "results.json").read_text())["best"] == {
      "metric": "score/score", "step": 3, "value": 3.0}


# ---------------------------------------------------------------- corrupt checkpoints


def _largest_data_file(step_dir):
  return max((step_dir / "state").rglob("d/*"), key=lambda p: p.stat().st_size)


def _remove_state(step_dir):
  shutil.rmtree(step_dir / "state")


def _truncate_iterator_state(step_dir):
  path = step_dir / "data" / "metadata"
  path.write_text(path.read_text()[:5])


def _truncate_tensorstore_file(step_dir):
  path = _largest_data_file(step_dir)
  os.truncate(path, path.stat().st_size // 2)


def _empty_step_dir(step_dir):
  shutil.rmtree(step_dir)
  step_dir.mkdir()


def _flip_bytes(step_dir):
  path = _largest_data_file(step_dir)
  data = bytearray(path.read_bytes())
  data[len(data) // 2] ^= 0xFF
  path.write_bytes(bytes(data))


CORRUPTIONS = {
    "removed state/": (_remove_state, r"\(state/ is missing\)"),
    "truncated iterator state": (_truncate_iterator_state,
                                 r"\(data/metadata \(the input iterator's state\) does not "
                                 r"read as JSON: .*\)"),
    "truncated tensorstore file": (_truncate_tensorstore_file,
                                   r"\(state/ocdbt\.process_0/d/\w+ has \d+ bytes, \d+ when "
                                   r"written\)"),
    "empty step directory": (_empty_step_dir, r"\(the step directory is empty\)"),
    "flipped bytes": (_flip_bytes, r"\(state/ocdbt\.process_0/d/\w+ fails its CRC-32 "
                                   r"\(checksums\.json\): its bytes changed since written\)"),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_a_corrupt_newest_checkpoint_falls_back_with_one_line(recovered_run, tmp_path, caplog,
                                                              kind):
  corrupt, problem = CORRUPTIONS[kind]
  workdir = tmp_path / "run"
  shutil.copytree(recovered_run[0], workdir)
  corrupt(workdir / "checkpoints" / "6")
  with caplog.at_level(logging.WARNING):
    _, step = checkpointing.restore_raw(workdir)
  assert step == 5
  lines = _warnings(caplog, "is incomplete or corrupt")
  assert len(lines) == 1, lines
  assert re.fullmatch(f"checkpoint {workdir}/checkpoints/6 is incomplete or corrupt "
                      f"{problem}; reading step 5 instead", lines[0]), lines[0]
  with pytest.raises(checkpointing.CorruptCheckpointError, match=f"{workdir}/checkpoints/6: "):
    checkpointing.restore_raw(workdir, 6)


def test_resume_skips_every_corruption_kind_and_reruns_bit_identical(recovered_run, tmp_path,
                                                                     caplog):
  """Steps 6..2 corrupt, one kind each: the run resumes from 1, logs one line per step,
  and saves 2..6 again, the same bits as before."""
  source, _, _, _, _ = recovered_run
  workdir = tmp_path / "run"
  shutil.copytree(source, workdir)
  for step, kind in zip((6, 5, 4, 3, 2), sorted(CORRUPTIONS)):
    CORRUPTIONS[kind][0](workdir / "checkpoints" / str(step))
  config = tiny_config(**{"train.checkpoint_every_steps": 1, "train.keep_checkpoints": 10,
                          "train.num_steps": 6})
  with caplog.at_level(logging.INFO):
    _trainer(config, workdir).train()
  lines = _warnings(caplog, "is incomplete or corrupt")
  assert len(lines) == 5, lines
  assert all(line.endswith("resuming from step 1 instead, and it is deleted") for line in lines)
  assert any("resumed from" in r.getMessage() and "at step 1" in r.getMessage()
             for r in caplog.records)
  ckpt = checkpointing.Checkpointer(workdir / "checkpoints", async_save=False)
  assert ckpt.all_steps() == [1, 2, 3, 4, 5, 6]
  assert all(ckpt.problem(s) is None for s in ckpt.all_steps())
  want, _ = checkpointing.restore_raw(source, 6)
  got, _ = ckpt.restore_raw(6)
  for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    np.testing.assert_array_equal(a, b)


def test_no_intact_checkpoint_is_an_error_naming_the_directory(recovered_run, tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(recovered_run[0], workdir)
  for step in _steps(workdir / "checkpoints"):
    _remove_state(workdir / "checkpoints" / str(step))
  with pytest.raises(checkpointing.CorruptCheckpointError,
                     match=f"{workdir}/checkpoints: no intact checkpoint \\(6: state/ is "
                           "missing; 5: .*; 1: state/ is missing\\)"):
    checkpointing.restore_raw(workdir)
