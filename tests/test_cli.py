"""The command-line family as a new user meets it: every program's --help, and the bad
inputs that used to end in a traceback wall, each run as its own process.

Each bad input must exit non-zero with at most 8 lines, no traceback, and the words
that say what to fix; a workdir holding another run is refused naming both; a paper
config that fails leaves no directory behind. The processes run 4 at a time; most of
them stop before JAX is imported, which is what keeps them fast.
"""
import concurrent.futures
import dataclasses
import os
import pathlib
import subprocess
import sys

from absl import flags
import pytest

from avtext import cli
from tests.test_train_trainer import REPO

PROGRAMS = ("avtext.main", "avtext.aot", "avtext.index", "avtext.search_videos",
            "avtext.search_moments", "avtext.caption", "avtext.serve", "avtext.mine",
            "avtext.materialize",
            "avtext.import_checkpoint", "avtext.features coot_text",
            "avtext.features tvr_text", "avtext.features smit",
            "avworld.tools.coot_synthetic", "avtext.tools.coot_meta",
            "avworld.tools.tvr_synthetic",
            "avtext.tools.caption_vocab", "avtext.tools.tvr_eval",
            "avworld.tools.synthetic_layout", "avworld.tools.mining_world",
            "avtext.tools.mining_report")


@dataclasses.dataclass
class Case:
  program: str
  args: list
  words: tuple  # each must appear in the output
  gone: tuple = ()  # paths that must not exist afterwards


def _run(program: str, args, env) -> subprocess.CompletedProcess:
  module, *kind = program.split()
  return subprocess.run([sys.executable, "-m", module, *kind, *map(str, args)], cwd=REPO,
                        env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                        timeout=300, check=False)


def _run_all(jobs, env):
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    return list(pool.map(lambda job: _run(*job, env), jobs))


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  home = tmp_path_factory.mktemp("home")
  return dict(os.environ, HOME=str(home), AVTEXT_COMPILATION_CACHE=str(home / "jax_cache"),
              XLA_FLAGS="--xla_force_host_platform_device_count=1")


def _program_module(program: str):
  """The module `python -m program` runs: a package's `__main__` (avtext.aot)."""
  import importlib  # pylint: disable=g-import-not-at-top
  module = importlib.import_module(program.replace(" ", "."))
  if not hasattr(module, "main") and hasattr(module, "__path__"):
    module = importlib.import_module(program.replace(" ", ".") + ".__main__")
  return module


def _help_in_process(program: str, capsys) -> str:
  """`program --help` through `cli.run`, as `python -m` runs it; its stdout."""
  module = _program_module(program)
  with pytest.raises(SystemExit) as done:
    cli.run(module.main, module.FLAGS, [f"python -m {program}", "--help"], doc=module.__doc__)
  assert done.value.code == 0, program
  return capsys.readouterr().out


def test_every_program_answers_help_with_exit_0_and_help_for_each_flag(env, capsys):
  for program in PROGRAMS:
    out = _help_in_process(program, capsys)
    assert f"flags of python -m {program}:" in out, (program, out[-800:])
    flag_lines = [l for l in out.splitlines() if l.startswith("  --")]
    assert flag_lines, program
    for line in flag_lines:
      name, _, text = line.strip().partition(": ")
      assert text.strip() and not text.startswith("(default"), (program, name)
  # As processes: the usage names the program, not its file; no traceback.
  for program, proc in zip(("avtext.main", "avtext.features smit"), _run_all(
      [("avtext.main", ["--help"]), ("avtext.features smit", ["-h"])], env)):
    assert proc.returncode == 0, (program, proc.stderr[-2000:])
    assert f"flags of python -m {program}:" in proc.stdout, program
    assert "__main__.py" not in proc.stdout and "Traceback" not in proc.stderr, program


def test_flag_values_of_every_program_have_help_and_expand_paths(monkeypatch, tmp_path):
  """In-process: each program's own FlagValues (importable side by side: no shared
  absl flag is claimed twice) has help on every flag, and its path flags expand ~."""
  monkeypatch.setenv("HOME", str(tmp_path))
  for program in PROGRAMS:
    module = _program_module(program)
    values: flags.FlagValues = module.FLAGS
    for name in values:
      assert values[name].help, (program, name)
    for name in values:
      if isinstance(values[name].parser, cli._PathParser):  # pylint: disable=protected-access
        assert values[name].parser.parse("~/x") == str(tmp_path / "x"), (program, name)


def _other_run(workdir: pathlib.Path) -> None:
  """A workdir whose config.json is the tiny AVR run with audio + RGB."""
  sys.path.insert(0, str(REPO))
  try:
    from configs import videocc_avr  # pylint: disable=g-import-not-at-top
  finally:
    sys.path.remove(str(REPO))
  workdir.mkdir(parents=True)
  (workdir / "config.json").write_text(videocc_avr.get_config("tiny").to_json_best_effort())


def test_bad_inputs_give_one_clear_message(env, tmp_path):
  avr = tmp_path / "avr_run"
  _other_run(avr)
  fake_index = pathlib.Path(env["HOME"]) / "my.index"
  paper = {name: tmp_path / f"paper_{name}" for name in ("coot", "avr", "mmt")}
  cases = [
      Case("avtext.main", ["--config=configs/nope.py", f"--workdir={tmp_path / 'x'}"],
           ("--config=configs/nope.py: no such file", "videocc_avr.py"), (tmp_path / "x",)),
      Case("avtext.main", ["--config=configs/videocc_avr.py:tiny",
                           "--config.train.batchsize=3", f"--workdir={tmp_path / 'x'}"],
           ("batchsize", 'Did you mean "batch_size"'), (tmp_path / "x",)),
      Case("avtext.main", ["--config=configs/videocc_avr.py:tyni", f"--workdir={tmp_path / 'x'}"],
           ("unknown variant", "tiny"), (tmp_path / "x",)),
      Case("avtext.main", ["--workdri=x", "--config=configs/videocc_avr.py:tiny"],
           ("unknown flag --workdri", "did you mean --workdir")),
      Case("avtext.main", ["--mode=eval", f"--workdir={tmp_path / 'nothing'}"],
           ("not an avtext run", "train it first"), (tmp_path / "nothing",)),
      Case("avtext.main", ["--config=configs/videocc_avr.py:tiny,rgb", f"--workdir={avr}"],
           ("holds another run", "model.video.modalities='rgb+audio'",
            "model.video.modalities='rgb'", "another --workdir")),
      Case("avtext.main", ["--config=configs/xml_tvr.py:tiny", f"--workdir={avr}"],
           ("holds another run", "task='avr'", "task='moments'")),
      # --mode=eval without --config reads the run's own config.json: this one has no
      # checkpoint, so it gets as far as asking for one.
      Case("avtext.main", ["--mode=eval", f"--workdir={avr}"],
           ("holds no checkpoint to evaluate",)),
      Case("avtext.main", ["--config=configs/coot_activitynet.py", "--allow_cpu",
                           f"--workdir={paper['coot']}"],
           ("config.dataset.path is not set", "coot_text"), (paper["coot"],)),
      Case("avtext.main", ["--config=configs/coot_activitynet.py", "--allow_cpu",
                           "--config.dataset.path=~/coot_data", f"--workdir={paper['coot']}"],
           (f"config.dataset.path='{pathlib.Path(env['HOME']) / 'coot_data'}' does not exist",),
           (paper["coot"],)),
      Case("avtext.main", ["--config=configs/videocc_avr.py", "--allow_cpu",
                           "--config.dataset.path=configs", f"--workdir={paper['avr']}"],
           ("init_from_vit.path", "ViT-B_16.npz"), (paper["avr"],)),
      Case("avtext.main", ["--config=configs/mmt_tvc.py", "--allow_cpu",
                           "--config.model.vocab_size=100", f"--workdir={paper['mmt']}"],
           ("config.model.vocab is not set", "caption_vocab"), (paper["mmt"],)),
      Case("avtext.main", ["--config=configs/videocc_avr.py", f"--workdir={paper['avr']}"],
           ("targets TPU", "--allow_cpu", ":demo"), (paper["avr"],)),
      Case("avtext.index", [f"--workdir={tmp_path / 'none'}", f"--videos={tmp_path}",
                            f"--out={tmp_path / 'idx'}"],
           ("config.json", str(tmp_path / "none")), (tmp_path / "idx",)),
      Case("avtext.index", [f"--workdir={avr}", f"--videos={tmp_path / 'no_videos'}",
                            f"--out={tmp_path / 'idx'}"],
           ("--videos=", "no such directory"), (tmp_path / "idx",)),
      Case("avtext.search_videos", ["--index=~/my.index", "a red ball"],
           (str(fake_index), "not an avtext index", "python -m avtext.index")),
      Case("avtext.search_videos", ["--index=~/my.index", "--video=~/clip.mp4"],
           ("--video ranks the lines of --captions",)),
      Case("avtext.search_moments", [f"--workdir={avr}", f"--corpus={tmp_path / 'corpus'}"],
           ("--queries", "must have a value")),
      Case("avtext.search_moments", [f"--workdir={avr}", f"--corpus={tmp_path / 'corpus'}",
                                     "--queries=-"],
           ("--corpus=", "no such directory")),
      Case("avtext.mine", [f"--seeds={tmp_path / 'seeds.tsv'}", f"--videos={tmp_path}",
                           f"--workdir={avr}", f"--out={tmp_path / 'mined'}", "--tua=0.5"],
           ("unknown flag", "--tua", "did you mean --tau"), (tmp_path / "mined",)),
      Case("avtext.mine", [f"--seeds={tmp_path / 'seeds.tsv'}", f"--videos={tmp_path}",
                           f"--workdir={avr}", f"--out={tmp_path / 'mined'}"],
           ("--seeds=", "no such file"), (tmp_path / "mined",)),
      Case("avtext.mine", [f"--seeds={avr / 'config.json'}", f"--videos={tmp_path}",
                           f"--workdir={tmp_path / 'no_run'}", f"--out={tmp_path / 'mined'}"],
           ("--workdir=", "not an avtext run"), (tmp_path / "mined",)),
      Case("avtext.caption", [f"--workdir={tmp_path / 'none'}", "README.md"],
           ("config.json", "avtext run directory")),
      Case("avtext.features coot_text", [f"--dataset_dir={tmp_path}"],
           ("meta_all.json not found",)),
      Case("avtext.import_checkpoint", ["--system=xml", f"--checkpoint={tmp_path / 'm.ckpt'}",
                                        f"--out={tmp_path / 'imported'}"],
           ("--checkpoint=", "no such file"), (tmp_path / "imported",)),
      Case("avtext.materialize", ["--config=configs/videocc_avr.py:tiny", "--name=x"],
           ("--data_dir", "must have a value")),
  ]
  results = _run_all([(c.program, c.args) for c in cases], env)
  for case, proc in zip(cases, results):
    out = (proc.stdout + proc.stderr).strip()
    what = f"{case.program} {' '.join(map(str, case.args))}:\n{out[-3000:]}"
    assert proc.returncode == 2, what
    assert "Traceback" not in out, what
    assert len(out.splitlines()) <= 8, what
    assert proc.stderr.strip().splitlines()[-1].startswith("error: "), what
    for word in case.words:
      assert word in out, (word, what)
    for path in case.gone:
      assert not path.exists(), (path, what)
  # The run directory that was refused is as it was.
  assert sorted(p.name for p in avr.iterdir()) == ["config.json"]


def test_debug_shows_the_traceback(env, tmp_path):
  proc = _run("avtext.main", ["--mode=eval", f"--workdir={tmp_path}", "--debug"], env)
  assert proc.returncode == 2 and "Traceback" in proc.stderr, proc.stderr
  assert proc.stderr.strip().splitlines()[-1].startswith("error: "), proc.stderr
