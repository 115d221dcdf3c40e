"""The command-line family fails soft (issue 46, parts 2, 3 and 5), in-process and cheap:

- flags and path flags are checked before any work (`cli.check_*`): an --out that is a
  file, an input that is a directory, a value out of range: one `error:` line, exit 2;
- one writer per output: index --out, mine --out, materialize, features (smit, tvr_text,
  coot_text) take the run directory's lock (`rundir.output_lock`); a second writer stops at once naming the
  flag and the owner, and a directory the lock made for nothing is removed;
- a stored corpus encoded at another step (or by another run) than `search_moments`
  loads is an error, not other scores;
- an input cut to fit says so;
- evaluator exports and small output files are replaced whole.

Each program runs through `cli.run` as `python -m` runs it (its stderr captured); only
the lock holder is another process (a flock is per process). Then, as a user runs them,
each program as its own process (2 at a time, every failing case reported at once): the
issue's cases and one bad input of each other kind, without JAX_PLATFORMS (no libtpu
noise may print); each answers before JAX embeds or loads anything, most in a second.
"""
import concurrent.futures
import os
import pathlib
import re
import subprocess
import sys
import types

import numpy as np
import pytest

from avtext import atomic
from avtext import cli
from avtext import errors
from avtext.inference import vcmr
from avtext.train import rundir
from tests.test_train_trainer import REPO

HIST = "callable:avtext.mining.embed:colour_histogram"


def _run(module_name: str, argv, capsys, *, known_only: bool = False,
         stdout: list | None = None) -> tuple[int, str]:
  """(exit status, stderr) of `python -m module_name argv`, in this process; its stdout is
  appended to `stdout` when given."""
  import importlib  # pylint: disable=g-import-not-at-top
  module = importlib.import_module(module_name.replace(" ", "."))
  code = 0
  try:
    cli.run(module.main, module.FLAGS, [f"python -m {module_name}", *map(str, argv)],
            doc=module.__doc__, known_only=known_only)
  except SystemExit as e:
    code = e.code
  captured = capsys.readouterr()
  if stdout is not None:
    stdout.append(captured.out)
  return code, captured.err


def _one_error_line(what, code, err, words, status=2):
  err = err.strip()
  assert code == status, (what, code, err[-2000:])
  assert "Traceback" not in err and len(err.splitlines()) <= 6, (what, err[-2000:])
  last = err.splitlines()[-1]
  assert last.startswith("error: "), (what, err)
  for word in words:
    assert word in last, (word, what, last)


@pytest.fixture(scope="module")
def places(tmp_path_factory):
  root = tmp_path_factory.mktemp("failsoft")
  (root / "a_file").write_text("x\n")
  (root / "videos").mkdir()
  (root / "run").mkdir()  # a run directory without a checkpoint
  sys.path.insert(0, str(REPO))
  try:
    from configs import videocc_avr  # pylint: disable=g-import-not-at-top
  finally:
    sys.path.remove(str(REPO))
  (root / "run" / "config.json").write_text(videocc_avr.get_config("tiny").to_json_best_effort())
  return root


def test_path_and_value_flags_are_checked_before_any_work(places, capsys, tmp_path):
  f, run = places / "a_file", places / "run"
  cases = [
      # An --out that is a file: refused before the run is even opened (it has no
      # checkpoint, which would be the error if the run came first).
      ("avtext.index", [f"--workdir={run}", f"--videos={places / 'videos'}", f"--out={f}"],
       ("--out=", "a file, not a directory")),
      ("avtext.index", [f"--workdir={run}", f"--videos={f}", f"--out={tmp_path / 'i'}"],
       ("--videos=", "a file, not a directory")),
      ("avtext.index", [f"--workdir={run}", f"--videos={places / 'videos'}",
                        f"--out={f / 'sub'}"], ("--out=", "is a file", "another path")),
      ("avtext.index", [f"--workdir={run}", f"--videos={places / 'videos'}",
                        f"--out={tmp_path / 'i'}", "--step=-1"], ("--step", "step number")),
      ("avtext.caption", [f"--workdir={run}", "--beam=0", "clip.mp4"], ("--beam=0",)),
      ("avtext.search_videos", ["--index=/nonexistent", "--top=0", "q"], ("--top=0",)),
      ("avtext.search_videos", [f"--index={places}", f"--video={places / 'videos'}",
                                f"--captions={f}"], ("--video=", "a directory")),
      ("avtext.search_moments", [f"--workdir={run}", f"--corpus={places}",
                                 f"--queries={places / 'videos'}"], ("--queries=", "a directory")),
      ("avtext.search_moments", [f"--workdir={run}", f"--corpus={places}", f"--queries={f}",
                                 "--top=-3"], ("--top=-3",)),
      ("avtext.materialize", ["--config=configs/videocc_avr.py:tiny", "--name=x",
                              f"--data_dir={f}"], ("--data_dir=", "a file, not a directory")),
      ("avtext.features smit", ["--config=configs/smit_language_amm.py:tiny", f"--out={f}"],
       ("--out=", "a file, not a directory")),
      ("avtext.features tvr_text", [f"--data={f}"], ("--data=", "not a directory")),
  ]
  for program, argv, words in cases:
    code, err = _run(program, argv, capsys)
    _one_error_line(f"{program} {argv}", code, err, words)
  assert not (tmp_path / "i").exists()


def test_one_writer_per_output(places, capsys, tmp_path):
  """A second writer of an index, mined clips, a materialized dataset or features stops
  at once, naming the flag and the process that holds it."""
  outs = {name: tmp_path / name for name in ("index", "mined", "data/x", "smit", "tvr", "coot")}
  holder = subprocess.Popen(
      [sys.executable, "-c", "import sys, time, contextlib\n"
       "from avtext.train import rundir\n"
       "with contextlib.ExitStack() as s:\n"
       "  for p in sys.argv[1:]: s.enter_context(rundir.output_lock(p, 'out'))\n"
       "  print('held', flush=True); time.sleep(600)\n", *map(str, outs.values())],
      cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "held"
    seeds = tmp_path / "seeds.tsv"
    seeds.write_text("s0\ts0.png\ta caption\n")
    (places / "videos" / "v.mp4").write_bytes(b"")
    cases = [
        ("avtext.index", [f"--workdir={places / 'run'}", f"--videos={places / 'videos'}",
                          f"--out={outs['index']}"], "--out="),
        ("avtext.mine", [f"--seeds={seeds}", f"--videos={places / 'videos'}",
                         f"--embedder={HIST}", f"--out={outs['mined']}"], "--out="),
        ("avtext.materialize", ["--config=configs/videocc_avr.py:tiny", "--name=x",
                                f"--data_dir={tmp_path / 'data'}"], "--data_dir="),
        ("avtext.features smit", ["--config=configs/smit_language_amm.py:tiny",
                                  f"--out={outs['smit']}"], "--out="),
        ("avtext.features tvr_text", [f"--data={outs['tvr']}"], "--data="),
        ("avtext.features coot_text", [f"--dataset_dir={outs['coot']}"], "--dataset_dir="),
    ]
    for program, argv, flag in cases:
      code, err = _run(program, argv, capsys, known_only=program == "avtext.mine")
      _one_error_line(program, code, err, (flag, f"in use by pid {holder.pid}",
                                           "only one run may write it"))
  finally:
    holder.kill()
    holder.wait()
  # Once the holder is gone the lock is free; a directory it made for nothing is removed.
  with rundir.output_lock(tmp_path / "fresh", "out"):
    assert (tmp_path / "fresh" / rundir.LOCK_FILE).exists()
  assert not (tmp_path / "fresh").exists()
  with rundir.output_lock(outs["index"], "out"):
    pass


def test_output_checks(tmp_path):
  (tmp_path / "f").write_text("x")
  cli.check_output_dir("out", str(tmp_path / "new" / "deeper"))  # made later: fine
  cli.check_output_dir("out", "gs://bucket/x")  # remote: its writer's to check
  with pytest.raises(errors.BadInput, match=r"--out=.*/f: a file, not a directory"):
    cli.check_output_dir("out", str(tmp_path / "f"))
  if os.geteuid() != 0:  # root writes anywhere
    locked = tmp_path / "ro"
    locked.mkdir(mode=0o500)
    with pytest.raises(errors.BadInput, match="not writable"):
      cli.check_output_dir("out", str(locked / "x"))
  with pytest.raises(errors.BadInput, match=r"--tau=1.5: must be in \[-1, 1\]; why"):
    cli.check_range("tau", 1.5, -1, 1, why="why")
  cli.check_range("tau", 0.5, -1, 1)


def _corpus(directory: pathlib.Path, **kwargs) -> vcmr.CorpusStore:
  w = vcmr.CorpusWriter(directory, num_videos=1, streams=("video",), dim=4, max_len=2,
                        **kwargs)
  w.add(["v"], [0], np.ones((1, 1, 2, 4)), np.ones((1, 1, 2, 4)), np.ones((1, 2)))
  return w.close()


def test_a_corpus_of_another_step_or_run_is_refused(tmp_path):
  from avtext import search_moments  # pylint: disable=g-import-not-at-top
  run = types.SimpleNamespace(workdir=tmp_path / "run", step=3)
  # An evaluator's store says who encoded it; an older one, its directory name.
  new = _corpus(tmp_path / "a", encoded_by={"workdir": str(tmp_path / "run"), "step": 6})
  old = _corpus(tmp_path / "test_step6")
  assert new.encoded_by == {"workdir": str(tmp_path / "run"), "step": 6}
  assert old.encoded_by == {"step": 6}
  assert _corpus(tmp_path / "mine").encoded_by == {}
  for store in (new, old):
    with pytest.raises(errors.BadInput, match=r"encoded at step 6, but the run is loaded at "
                       r"step 3 \(--step\).*pass --step=6"):
      search_moments.check_corpus(store, run, store.dir)
  search_moments.check_corpus(new, types.SimpleNamespace(workdir=run.workdir, step=6), new.dir)
  with pytest.raises(errors.BadInput, match="encoded by the run .*/run, not --workdir"):
    search_moments.check_corpus(new, types.SimpleNamespace(workdir=tmp_path / "b", step=6),
                                new.dir)


def test_a_cut_input_says_so(capsys):
  cli.note_cut("query 1 (12000 characters)", 2402, 32, "the model reads at most that many")
  err = capsys.readouterr().err
  assert err.startswith("note: query 1 (12000 characters) is 2402 tokens long; only its "
                        "first 32 are used") and len(err.splitlines()) == 1


def test_exports_and_small_outputs_are_written_atomically(tmp_path, monkeypatch):
  """Evaluator exports (moments submission, captions), the features' DONE marker and the
  mining outputs go through `avtext.atomic` (temporary file, fsync, rename): a
  reader or a crash sees the old file or the new one, never half of one."""
  from avtext.evals import captioning as captioning_eval  # pylint: disable=g-import-not-at-top
  from avtext.evals import vcmr as vcmr_eval  # pylint: disable=g-import-not-at-top
  from avtext.features import done  # pylint: disable=g-import-not-at-top
  written = []
  real = atomic.replace_with
  monkeypatch.setattr(atomic, "replace_with",
                      lambda path, write, **kw: (written.append(pathlib.Path(path).name),
                                                 real(path, write, **kw))[1])
  captioning_eval._write_coco(tmp_path / "coco.json", ["a cat"], ["1"])  # pylint: disable=protected-access
  captioning_eval._write_tvc(tmp_path / "tvc.jsonl", ["a cat"], ["1"],  # pylint: disable=protected-access
                             host={"ts": [[0, 1]], "vid_name": ["v"]}, keep=[0])
  vcmr_eval.VCMREvaluator._write(types.SimpleNamespace(workdir=tmp_path, name="test"),  # pylint: disable=protected-access
                                 {"VCMR": []}, 5)
  done.mark_finished(tmp_path, {"a": 1})
  assert written == ["coco.json", "tvc.jsonl", "test_step5.json", "DONE"]
  assert not list(tmp_path.glob(".*.tmp*"))


def test_programs_that_log_progress_drop_the_libraries_info():
  """main and the feature writers log their progress at INFO; orbax's INFO lines (and
  its save threads' tracebacks) are dropped from it, its warnings kept."""
  import logging  # pylint: disable=g-import-not-at-top
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  cli.log_progress()
  cli.log_progress()  # once is enough: no second filter
  quiet = [f for f in absl_logging.get_absl_handler().filters
           if isinstance(f, cli.QuietLibraries)]
  assert len(quiet) == 1

  def record(path, level, name="x"):
    return logging.LogRecord(name, level, path, 1, "m", (), None)

  orbax = "/site-packages/orbax/checkpoint/checkpoint_manager.py"
  assert not quiet[0].filter(record(orbax, logging.INFO))
  assert quiet[0].filter(record(orbax, logging.WARNING))
  assert quiet[0].filter(record("/avtext/features/smit.py", logging.INFO))
  assert not quiet[0].filter(record("/asyncio/base_events.py", logging.ERROR, "asyncio"))


@pytest.mark.parametrize("before, after", [
    ("--xla_force_host_platform_device_count=8",
     "--xla_force_host_platform_device_count=8 " + cli.SAFE_CPU_SCHEDULER),
    ("--xla_force_host_platform_device_count=1", "--xla_force_host_platform_device_count=1"),
    ("", ""),
    ("--xla_force_host_platform_device_count=2 "
     "--xla_cpu_enable_concurrency_optimized_scheduler=true",
     "--xla_force_host_platform_device_count=2 "
     "--xla_cpu_enable_concurrency_optimized_scheduler=true"),
])
def test_several_cpu_devices_get_the_in_order_collective_scheduler(monkeypatch, before, after):
  monkeypatch.setenv("XLA_FLAGS", before)
  cli.safe_cpu_collectives()
  assert os.environ["XLA_FLAGS"] == after


def run_processes(jobs, env, *, one_line: bool = False) -> list[str]:
  """Runs each (name, program, argv, words) as `python -m program argv` in the repository,
  2 at a time; returns, for each that did not exit 2 with at most 6 lines on stderr, no
  traceback, no libtpu noise and a last line `error: ...` holding every one of `words`,
  what went wrong. `one_line`: the error is the only line on stderr but for the
  program's own progress log lines (absl INFO: `I<mmdd> ...`, main's)."""
  def run(job):
    module, *kind = job[1].split()
    return subprocess.run([sys.executable, "-m", module, *kind, *map(str, job[2])], cwd=REPO,
                          env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=300, check=False)
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    procs = list(pool.map(run, jobs))
  failed = []
  for (name, program, argv, words), proc in zip(jobs, procs):
    err = proc.stderr.strip()
    last = err.splitlines()[-1] if err else ""
    wrong = [w for w in words if w not in last]
    others = [l for l in err.splitlines()[:-1] if not re.match(r"I\d{4} ", l)]
    if (proc.returncode != 2 or "Traceback" in err or "libtpu" in err or "TPU_" in err
        or len(err.splitlines()) > 6 or not last.startswith("error: ") or wrong
        or (one_line and others)):
      failed.append(f"{name}: {program} {' '.join(map(str, argv))}\n  exit {proc.returncode}, "
                    f"missing {wrong}\n  {err[-1500:]}")
  return failed


def user_env(home) -> dict:
  """A user's environment: JAX_PLATFORMS unset (the programs choose it), own caches."""
  env = dict(os.environ, HOME=str(home), AVTEXT_COMPILATION_CACHE="off",
             XLA_FLAGS="--xla_force_host_platform_device_count=2")
  env.pop("JAX_PLATFORMS", None)
  return env


def test_each_bad_input_as_a_process_is_one_line_exit_2(places, tmp_path):
  """The issue's cases (a corpus of another step, --tau / --top / --beam out of range, an
  --out that is a file, a second writer of an index) and one more of each other kind."""
  f, run, videos = places / "a_file", places / "run", places / "videos"
  corpus = _corpus(tmp_path / "corpus", encoded_by={"workdir": str(run), "step": 6})
  (tmp_path / "q.txt").write_text("Alice : we should talk about the weather\n")
  (tmp_path / "empty.txt").write_text("\n")
  (tmp_path / "empty.tsv").write_text("")
  seeds = tmp_path / "seeds.tsv"
  seeds.write_text("s0\ts0.png\ta caption\n")
  held = tmp_path / "held.index"
  idx = ["--workdir", run, "--videos", videos]
  mine = [f"--seeds={seeds}", f"--videos={videos}", f"--embedder={HIST}"]
  jobs = [  # (what, program, argv, words of the error line)
      # The cases.
      ("corpus of another step", "avtext.search_moments",
       [f"--workdir={run}", f"--corpus={corpus.dir}", f"--queries={tmp_path / 'q.txt'}",
        "--step=3"], ("--corpus=", "encoded at step 6", "pass --step=6")),
      ("tau out of range", "avtext.mine", [*mine, f"--out={tmp_path / 'm'}", "--tau=1.5"],
       ("--tau=1.5", "[-1.0, 1.0]")),
      ("--out a file", "avtext.index", [*idx, "--out", f], ("--out=", "a file, not a directory")),
      ("a second writer", "avtext.index", [*idx, "--out", held],
       ("--out=", "in use by pid", "only one run may write it")),
      ("--top=0", "avtext.search_videos", [f"--index={places}", "--top=0", "q"], ("--top=0",)),
      ("--beam=0", "avtext.caption", [f"--workdir={run}", "--beam=0", f], ("--beam=0",)),
      # One of each other kind.
      ("a video that is a folder", "avtext.caption", [f"--workdir={run}", videos],
       ("a directory, not a video file", "give the files in it")),
      ("no video file exists", "avtext.caption", [f"--workdir={run}", tmp_path / "a.mp4",
                                                  tmp_path / "b.mp4"],
       ("a.mp4: no such file", "nor any of the others")),
      ("an empty query", "avtext.search_videos", [f"--index={places}", " "],
       ("query 1 is empty",)),
      ("an empty query file", "avtext.search_moments",
       [f"--workdir={run}", f"--corpus={corpus.dir}", f"--queries={tmp_path / 'empty.txt'}"],
       ("--queries=", "no queries in it")),
      ("an empty seeds file", "avtext.mine",
       [f"--seeds={tmp_path / 'empty.tsv'}", f"--videos={videos}", f"--embedder={HIST}",
        f"--out={tmp_path / 'm'}"], ("--seeds=", "no seeds in it", "seed_id<TAB>")),
      ("an unknown choice", "avtext.materialize",
       ["--config=configs/videocc_avr.py:tiny", "--name=x", f"--data_dir={tmp_path / 'd'}",
        "--format=gif"], ("--format=gif", "frames_jpeg")),
      ("a config that is a folder", "avtext.materialize",
       ["--config=configs", "--name=x", f"--data_dir={tmp_path / 'd'}"],
       ("--config=configs: a directory, not a config file", "configs/<experiment>.py")),
      ("an unknown kind", "avtext.features", ["coot_txt"], ("unknown kind 'coot_txt'",
                                                           "coot_text")),
      ("a dataset folder that is a file", "avtext.features coot_text", [f"--dataset_dir={f}"],
       ("--dataset_dir=", "a file, not a directory")),
      ("a stray argument", "avtext.index", [*idx, "--out", tmp_path / "i", "extra"],
       ("unexpected arguments ['extra']",)),
      ("an unknown accelerator", "avtext.aot", ["--config=configs/videocc_avr.py:tiny",
                                                "--topology=v9x:2x2"],
       ("unknown chip 'v9x'", "v5e:4x4")),
  ]
  holder = subprocess.Popen(
      [sys.executable, "-c", "import sys, time\nfrom avtext.train import rundir\n"
       "with rundir.output_lock(sys.argv[1], 'out'):\n  print('held', flush=True)\n"
       "  time.sleep(600)\n", str(held)], cwd=REPO, stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "held"
    failed = run_processes(jobs, user_env(tmp_path))
  finally:
    holder.kill()
    holder.wait()
  assert not failed, "\n".join(failed)
  assert not (tmp_path / "m").exists() and not (tmp_path / "i").exists()
