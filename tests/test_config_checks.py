"""Every config value a user can set wrongly is refused before work starts, in one line.

`experiment.check_config` in-process for one bad value of each kind (it reads values
only: milliseconds); then, as processes, the cases a new user reported (tracebacks
before): exit 2, one `error: --config.<field>=<value>: ...` line naming the fix, no
traceback, no directory made. Each `:tiny` variant passes the same checks, and the
ones that need no prepared data also their inputs, task and evaluators.
"""
import concurrent.futures
import os
import subprocess
import sys

import pytest

from avtext import errors
from avtext import evals
from avtext import experiment
from avtext.models import attention
from avtext.tasks import task_registry
from avtext.train import optimizers
from tests.test_train_trainer import REPO
from tests.test_train_trainer import tiny_config
from tests.test_train_trainer import with_overrides


def _caption_config(**overrides):
  sys.path.insert(0, str(REPO / "configs"))
  try:
    import videocc_caption  # pylint: disable=g-import-not-at-top
  finally:
    sys.path.remove(str(REPO / "configs"))
  return with_overrides(videocc_caption.get_config("tiny"), **overrides)


# (override, devices, words of the message: the flag and value first)
BAD = [
    ({"train.batch_size": 0}, 1, ("--config.train.batch_size=0", "at least 1")),
    ({"train.batch_size": -8}, 1, ("--config.train.batch_size=-8", "at least 1")),
    ({"train.batch_size": 7}, 2, ("--config.train.batch_size=7", "multiple of 2", "e.g. 6")),
    ({"eval.batch_size": 12}, 8, ("--config.eval.batch_size=12", "multiple of 8")),
    ({"evals.test.batch_size": 3}, 2, ("--config.evals.test.batch_size=3", "multiple of 2")),
    ({"num_devices": 4}, 2, ("--config.num_devices=4", "at most 2")),
    ({"train.microbatches": 3}, 1, ("--config.train.microbatches=3", "micro-batches")),
    ({"model.video.modalities": "rgb+audoi"}, 1,
     ("--config.model.video.modalities=rgb+audoi", "rgb+audio")),
    ({"optimizer.name": "adamm"}, 1, ("--config.optimizer.name=adamm", "adamw")),
    ({"optimizer.schedule": "cosin"}, 1, ("--config.optimizer.schedule=cosin", "cosine")),
    ({"optimizer.learning_rate": -1.0}, 1, ("--config.optimizer.learning_rate=-1.0", "above 0")),
    ({"optimizer.learning_rate": float("nan")}, 1, ("learning_rate=nan", "finite")),
    ({"optimizer.weight_decay": -0.1}, 1, ("--config.optimizer.weight_decay=-0.1", "0 or more")),
    ({"optimizer.warmup_steps": -2}, 1, ("--config.optimizer.warmup_steps=-2", "0 or more")),
    ({"dataset.num_train": 0}, 1, ("--config.dataset.num_train=0", "at least 1")),
    ({"dataset.num_eval": -3}, 1, ("--config.dataset.num_eval=-3", "at least 1")),
    ({"train.num_steps": -5}, 1, ("--config.train.num_steps=-5", "at least 1")),
    ({"train.num_steps": 0}, 1, ("--config.train.num_steps=0", "at least 1")),
    ({"train.num_steps": None, "train.num_epochs": None}, 1, ("train.num_epochs",)),
    ({"train.checkpoint_every_steps": 0}, 1, ("checkpoint_every_steps=0", "at least 1")),
    ({"train.keep_checkpoints": 0}, 1, ("--config.train.keep_checkpoints=0", "at least 1")),
    ({"evals.test.every_steps": -1}, 1, ("--config.evals.test.every_steps=-1", "0 or more")),
    ({"model.video.hidden_size": 0}, 1, ("--config.model.video.hidden_size=0", "at least 1")),
    ({"model.video.num_heads": 3}, 1, ("--config.model.video.num_heads=3", "hidden_size 32")),
    ({"model.video.dropout_rate": 1.5}, 1, ("--config.model.video.dropout_rate=1.5", "[0, 1)")),
    ({"loss.temperature": 0.0}, 1, ("--config.loss.temperature=0.0", "above 0")),
    ({"model.attention": "flsh"}, 1, ("--config.model.attention=flsh",
                                      ", ".join(attention.ATTENTION_IMPLEMENTATIONS))),
    ({"model.video.rgb_pool": "mean"}, 1, ("--config.model.video.rgb_pool=mean", "cls, max")),
    ({"eval.select": ("nope/R@1", "max")}, 1, ("--config.eval.select", "'nope'", "test")),
    ({"eval.select": ("test/R@1", "most")}, 1, ("--config.eval.select", "'max' | 'min'")),
]


@pytest.mark.parametrize("override,devices,words", BAD, ids=[str(b[0]) for b in BAD])
def test_one_bad_value_of_each_kind_is_one_line_naming_flag_and_fix(override, devices, words):
  with pytest.raises(errors.BadInput) as bad:
    experiment.check_config(tiny_config(**override), devices)
  message = str(bad.value)
  assert "\n" not in message and message.startswith("--config."), message
  for word in words:
    assert word in message, (word, message)


def test_choices_come_from_the_tables_of_the_code_that_reads_them():
  """A name the code's table gains is accepted: the check holds no list of its own."""
  config = tiny_config(**{"optimizer.name": "lion"})
  with pytest.raises(errors.BadInput):
    experiment.check_config(config, 1)
  try:
    optimizers.OPTIMIZERS += ("lion",)
    experiment.check_config(config, 1)
  finally:
    optimizers.OPTIMIZERS = optimizers.OPTIMIZERS[:-1]
  bad_pool = _caption_config(**{"model.context_pool": "median"})
  with pytest.raises(errors.BadInput, match="context_pool=median: unknown; set it to one of "
                                            "mean, max"):
    experiment.check_config(bad_pool, 1)


def test_a_baseline_missing_its_run_is_refused_when_the_evaluators_are_built():
  config = _caption_config(**{"evals.test.baselines.nearest_neighbour": dict(
      run=None, step=None, num_train=32, num_clips=1)})
  task = task_registry.build_task(config)
  with pytest.raises(ValueError, match=r"^config.evals.test.baselines.nearest_neighbour.run "
                                       "is not set: set it to the run directory"):
    evals.build_evaluators(config, task)


TINY = {  # every config's :tiny variant -> what `main` needs besides --config and --workdir
    "videocc_avr.py:tiny": None, "videocc_caption.py:tiny": None,
    "synthetic_video_pretrain.py:tiny": None, "smit_language_amm.py:tiny,phase2": None,
    "smit_spoken_amm.py:tiny,phase2": None,
    # Features written by a tool first (the paper layouts): the error names the field.
    "coot_activitynet.py:tiny": "config.dataset.path", "coot_youcook2.py:tiny":
    "config.dataset.path", "xml_tvr.py:tiny": "config.dataset.path",
    "mmt_tvc.py:tiny": "config.model.vocab", "smit_language_amm.py:tiny":
    "config.dataset.path", "smit_spoken_amm.py:tiny": "config.dataset.path",
}


@pytest.mark.parametrize("variant", sorted(TINY))
def test_every_tiny_variant_passes_the_checks_main_runs_before_training(variant, monkeypatch):
  import importlib.util  # pylint: disable=g-import-not-at-top
  monkeypatch.chdir(REPO)
  monkeypatch.syspath_prepend(str(REPO / "configs"))
  path, arg = variant.split(":")
  spec = importlib.util.spec_from_file_location("config_under_test", f"configs/{path}")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config(arg)
  for devices in (1, 2, 8):
    experiment.check_config(config, devices)
  if TINY[variant] is None:  # what main checks before it makes the workdir, in its order
    task = task_registry.build_task(config)
    experiment.check_inputs(config, task)
    assert len(task.train_source) >= config.train.batch_size
    assert evals.build_evaluators(config, task)
  else:
    with pytest.raises((ValueError, FileNotFoundError), match=TINY[variant]):
      task = task_registry.build_task(config)
      experiment.check_inputs(config, task)
      task.train_source  # pylint: disable=pointless-statement


PAPER = ("videocc_avr.py", "videocc_caption.py", "smit_language_amm.py",
         "smit_spoken_amm.py", "coot_activitynet.py", "coot_youcook2.py", "xml_tvr.py",
         "mmt_tvc.py")


def _smoke_commands() -> dict[str, list[str]]:
  """{config file: the --config flags of its command} of docs/scale.md's CPU smoke runs."""
  import shlex  # pylint: disable=g-import-not-at-top
  text = (REPO / "docs" / "scale.md").read_text()
  section = text[text.index("## CPU smoke runs of the paper configs"):]
  block = section.split("```")[1].replace("\\\n", " ")
  commands = [shlex.split(line) for line in block.splitlines() if line.startswith("python")]
  return {next(a for a in c if a.startswith("--config="))[len("--config=configs/"):]:
          [a for a in c if a.startswith("--config")] for c in commands}


def test_every_paper_config_has_a_cpu_smoke_run_that_the_flags_shorten(monkeypatch):
  """docs/scale.md's smoke run of each paper config parses (every data path it sets can be
  set from the command line) and `--config.train.num_steps=N` sets the run's length,
  whether the paper counts steps or epochs."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  from avtext.train import trainer  # pylint: disable=g-import-not-at-top
  commands = _smoke_commands()
  assert sorted(commands) == sorted(PAPER)
  monkeypatch.chdir(REPO)
  monkeypatch.syspath_prepend(str(REPO))
  for path, argv in commands.items():
    argv = ["main", *argv]
    monkeypatch.setattr(sys, "argv", argv)  # config_flags reads its overrides from sys.argv
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True)
    values(argv)
    # 2 steps whatever the split's size (10**6 examples: a paper run of thousands of steps)
    assert trainer.total_train_steps(values.config, 10**6)[0] == 2, path
    assert values.config.dataset.path.startswith("data/"), path


def _main(args, tmp_path):
  """`python -m avtext.main` on 2 CPU devices, JAX_PLATFORMS unset as a user's is (main
  picks it: no libtpu noise may print)."""
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
             AVTEXT_COMPILATION_CACHE="off")
  env.pop("JAX_PLATFORMS", None)
  return subprocess.run([sys.executable, "-m", "avtext.main", f"--workdir={tmp_path / 'w'}",
                         *args], cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=300, check=False)


def _run_cases(cases, tmp_path) -> None:
  """Each (args, words) as a `main` process (2 at a time; most stop before JAX is
  imported): exit 2, at most 6 lines, no traceback or libtpu line, the last `error: ...`
  holding `words`; every failing case is reported at once, and no workdir was made."""
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    procs = list(pool.map(lambda case: _main(case[0], tmp_path / str(id(case))), cases))
  failed = []
  for (args, words), proc in zip(cases, procs):
    lines = proc.stderr.strip().splitlines() or [""]
    if (proc.returncode != 2 or "Traceback" in proc.stderr or "libtpu" in proc.stderr
        or len(lines) > 6 or not lines[-1].startswith("error: ") or words not in lines[-1]):
      failed.append(f"{args}: exit {proc.returncode}, wanted {words!r}:\n{proc.stderr[-2000:]}")
  assert not failed, "\n".join(failed)
  assert not any(p.name == "w" for p in tmp_path.rglob("w"))  # no workdir was made


def test_the_reported_cases_end_in_one_line_before_anything_is_made(tmp_path):
  from tests.test_tasks_coot import write_tiny_dataset  # pylint: disable=g-import-not-at-top
  from tests.test_tasks_xml import write_synthetic_tvr  # pylint: disable=g-import-not-at-top
  corrupt = tmp_path / "corrupt"
  corrupt.mkdir()
  (corrupt / "config.json").write_text("{not json")
  (tmp_path / "tvr").mkdir()
  (tmp_path / "coot").mkdir()
  write_synthetic_tvr(tmp_path / "tvr", num=(2, 1, 1))  # features 8-d; the tiny XML's 128
  write_tiny_dataset(tmp_path / "coot", num_train=2, num_val=1, video_dim=8)  # tiny: 16
  tiny = "--config=configs/videocc_avr.py:tiny"
  cases = [
      ([tiny, "--config.train.batch_size=0"], "--config.train.batch_size=0"),
      ([tiny, "--config.train.batch_size=-8"], "--config.train.batch_size=-8: must be a whole"),
      ([tiny, "--config.train.batch_size=7"], "multiple of 2"),
      ([tiny, "--config.model.video.modalities=rgb+audoi"], "modalities=rgb+audoi"),
      ([tiny, "--config.optimizer.name=adamm"], "--config.optimizer.name=adamm"),
      ([tiny, "--config.dataset.num_train=0"], "--config.dataset.num_train=0: must be a whole"),
      ([tiny, "--config.train.num_steps=-5"], "--config.train.num_steps=-5: must be a whole"),
      ([tiny, f"--workdir={corrupt}"], "delete that file and re-run the training command"),
      (["--mode=eval", f"--workdir={corrupt}"], "delete that file and re-run the training"),
      (["--mode=eval", "--step=abc"], "--step=abc: 'abc' is no checkpoint step; pass a step"),
      # Features of another width: the flag to set, and to what.
      (["--config=configs/xml_tvr.py:tiny", f"--config.dataset.path={tmp_path / 'tvr'}"],
       "--config.dataset.video_dim=128: the features in"),
      (["--config=configs/coot_activitynet.py:tiny", f"--config.dataset.path={tmp_path / 'coot'}",
        "--config.dataset.video_features=tiny_video", "--config.dataset.text_features=tiny_text"],
       "are 8-d; set --config.dataset.video_dim=8 --config.model.video_dim=8"),
  ]
  _run_cases(cases, tmp_path)
  assert sorted(p.name for p in corrupt.iterdir()) == ["config.json"]


def test_one_bad_input_of_each_other_kind_as_a_process(tmp_path):
  """Mistakes beyond the reported ones, one of a kind, as `main` processes."""
  (tmp_path / "a_file").write_text("x\n")
  tiny = "--config=configs/videocc_avr.py:tiny"
  coot = "--config=configs/coot_activitynet.py:tiny"
  cases = [
      (["--config=configs"], "--config=configs: a directory, not a config file"),
      ([tiny, f"--workdir={tmp_path / 'a_file'}"], "a_file: a file, not a directory"),
      ([tiny, "--step=3"], "--step goes with --mode=eval"),
      ([tiny, "--config.loss.name=ncee"], "--config.loss.name=ncee: avr trains with nce"),
      ([tiny, "--config.loss.temperature=-1"], "--config.loss.temperature=-1.0: must be a "
                                               "number above 0"),
      ([tiny, "--config.optimizer.learning_rate=-0.001"],
       "--config.optimizer.learning_rate=-0.001: must be a finite number above 0"),
      ([tiny, "--config.eval.batch_size=3"], "--config.eval.batch_size=3: does not split over "
                                             "the 2 devices"),
      ([tiny, "--config.num_devices=4"], "--config.num_devices=4: the config leaves this field "
                                         "unset"),
      ([tiny, "--config.train.batch_size=abc"], "--config.train.batch_size=abc: invalid literal"),
      ([coot, "--config.dataset.video_dim=8"], "--config.model.video_dim=16: the model reads "
                                               "config.dataset.video_dim=8"),
      (["--mode=eval", f"--eval_dir={tmp_path / 'a_file'}"], "--eval_dir="),
  ]
  _run_cases(cases, tmp_path)
