"""The last tracebacks of the command-line family, each now one line (issue 56, items 8-11,
14, 15), run as a user runs them (a process each) where the process is the point:

- Ctrl-C during `avtext.mine` (SIGINT to its process group: Beam's workers too) or
  SIGTERM to it: one line, exit 130 / 143, the --out of an earlier run as it was;
- a corrupt index (meta.json, vectors.npy, index.faiss) to `avtext.search_videos` and to
  `avtext.index`: which file, and to delete the index and index again; the index is
  left as it was;
- a loss or parameters that go non-finite: the step, the value and advice from the run's
  config, exit 1, the last finite checkpoint kept (one tiny run that blows up, `blown_up`);
- resuming that run, its config.json gone, with another model: the first parameter that
  differs and its two shapes, exit 2, the checkpoints untouched;
- quiet: the blown-up run (JAX's compilation cache on), the resume and a notebook's
  `runs.load_run` print no orbax type-handler line, cache warning or libtpu line.
"""
import hashlib
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings

import ml_collections
import numpy as np
import pytest

from avtext import cli
from avtext import index as index_lib
from avtext.train import checkpointing
from avtext.train import nonfinite
from avworld import mining_corpus
from tests.test_cli_failsoft import run_processes
from tests.test_cli_failsoft import user_env
from tests.test_mining import TINY
from tests.test_train_trainer import REPO

# What a program on a CPU must not print (item 15): orbax's note on our jax.Array handler,
# JAX's compilation-cache warnings, the TPU / CUDA probes of libtpu and the CUDA plugin.
NOISE = re.compile(r"Type handler registry|compilation cache|libtpu|TPU_|cuda|CUDA", re.I)


def _tiny_index(out: pathlib.Path) -> pathlib.Path:
  """An index of 3 videos, 2 clips each, 4 dimensions (no run: the files alone)."""
  clips = np.random.default_rng(0).normal(size=(3, 2, 4)).astype(np.float32)
  index_lib.write(out, ["a.mp4", "b.mp4", "c.mp4"], clips, [[1, 2]] * 3,
                  {"format": index_lib.FORMAT, "run": {}, "videos": str(out.parent)})
  return out


def _digests(directory: pathlib.Path) -> dict:
  return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}


def test_a_corrupt_index_is_one_line_saying_to_index_again(tmp_path):
  good = _tiny_index(tmp_path / "good")
  assert index_lib.VideoIndex(good).search(np.ones((1, 4), np.float32), 2)[1].shape == (1, 2)
  corrupt = {  # (index, its broken file, what the error says of it)
      "meta.json": (b'{"format": "avtext.vid', "meta.json: not JSON"),
      "vectors.npy": (None, "vectors.npy: not a numpy array file"),
      "index.faiss": (None, "index.faiss: not a FAISS index"),
  }
  (tmp_path / "videos").mkdir()
  jobs, before = [], {}
  for name, (data, words) in corrupt.items():
    broken = tmp_path / name.replace(".", "_")
    shutil.copytree(good, broken)
    whole = (broken / name).read_bytes()
    (broken / name).write_bytes(data if data is not None else whole[:len(whole) // 2])
    before[broken] = _digests(broken)
    said = (f"{broken}: a corrupt index ({words}); delete it and index again",
            f"--out={broken}")
    jobs += [(f"search {name}", "avtext.search_videos", [f"--index={broken}", "a dog"], said),
             (f"index {name}", "avtext.index", [f"--workdir={tmp_path / 'run'}",
                                                f"--videos={tmp_path / 'videos'}",
                                                f"--out={broken}"], said)]
  failed = run_processes(jobs, user_env(tmp_path), one_line=True)
  assert not failed, "\n".join(failed)
  for broken, digests in before.items():  # nothing rewritten, nothing removed
    assert _digests(broken) == digests, broken


def _not_progress(stderr: str) -> list[str]:
  """stderr's lines but main's own progress log (absl INFO: `I<mmdd> ...`)."""
  return [l for l in stderr.strip().splitlines() if not re.match(r"I\d{4} ", l)]


@pytest.fixture(scope="module")
def blown_up(tmp_path_factory):
  """(workdir, the process): the tiny AVR run at learning rate 1e30 without gradient
  clipping, a checkpoint every step; its warmup (2 steps) moves nothing at step 1 and
  everything by ~1e29 at step 2, whose parameters' norm overflows."""
  root = tmp_path_factory.mktemp("blown_up")
  (root / "a_file").write_text("")  # a compilation cache no directory can be made for
  env = dict(user_env(root), XLA_FLAGS="--xla_force_host_platform_device_count=1",
             AVTEXT_COMPILATION_CACHE=str(root / "a_file" / "jax"))
  proc = subprocess.run(
      [sys.executable, "-m", "avtext.main", "--config=configs/videocc_avr.py:tiny",
       f"--workdir={root / 'run'}", "--config.optimizer.learning_rate=1e30",
       "--config.optimizer.grad_clip_norm=0.0", "--config.train.num_steps=4",
       "--config.train.checkpoint_every_steps=1", "--config.dataset.num_eval=8"],
      cwd=REPO, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
      timeout=300, check=False)
  return root / "run", proc


def test_a_non_finite_run_is_one_line_with_advice_and_keeps_its_last_checkpoint(blown_up):
  workdir, proc = blown_up
  assert proc.returncode == 1 and proc.stdout == "", proc.stderr[-3000:]
  assert _not_progress(proc.stderr) == [
      "error: the parameters after step 2 have a non-finite global norm (inf); training "
      f"stopped, the last finite checkpoint, {workdir}/checkpoints/1, is kept and re-running "
      "resumes from it. Lower the learning rate (--config.optimizer.learning_rate=1e+29, a "
      "tenth of 1e+30) or clip the gradients (--config.optimizer.grad_clip_norm=1.0; none "
      "now)."], proc.stderr[-3000:]
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["1"]
  params, step = checkpointing.restore_raw(workdir)
  assert step == 1 and all(np.isfinite(x).all() for x in _leaves(params["params"]))


def _leaves(tree):
  return [v for x in tree.values() for v in (_leaves(x) if isinstance(x, dict) else [x])]


def test_the_advice_fits_the_config():
  def config(**optimizer):
    return ml_collections.ConfigDict(dict(
        optimizer={**dict(learning_rate=3e-4, grad_clip_norm=1.0, warmup_steps=100,
                          warmup_epochs=None), **optimizer},
        model=dict(dtype="float32"), init_from=dict(workdir=None)))
  assert nonfinite.advice(config(), 7) == (
      "Lower the learning rate (--config.optimizer.learning_rate=3e-05, a tenth of 0.0003).")
  bare = config(grad_clip_norm=None, warmup_steps=0)
  bare.model.dtype = "float16"
  assert nonfinite.advice(bare, 7) == (
      "Lower the learning rate (--config.optimizer.learning_rate=3e-05, a tenth of 0.0003), "
      "clip the gradients (--config.optimizer.grad_clip_norm=1.0; none now), warm the rate "
      "up (--config.optimizer.warmup_steps=N; none now) or compute in bfloat16 "
      "(--config.model.dtype=bfloat16; float16 overflows above 65504).")
  first = config()  # step 1's loss comes before any update: not the learning rate's doing
  first.init_from.workdir = "runs/tower"
  assert nonfinite.advice(first, 1) == (
      "The first step's loss comes from the weights before any update: look for NaN or inf "
      "in the training inputs (features, audio) or the weights of config.init_from "
      "(runs/tower).")


def test_resuming_with_another_model_names_the_first_parameter_that_differs(blown_up,
                                                                           tmp_path):
  """The run's config.json is gone, so main cannot tell it is another run: the restore
  says which parameter does not fit (the text projection: embed_dim 16 -> 24)."""
  workdir = tmp_path / "run"
  shutil.copytree(blown_up[0], workdir)
  (workdir / "config.json").unlink()
  before = _digests_under(workdir / "checkpoints")
  saved, _ = checkpointing.restore_raw(workdir)
  assert saved["params"]["text_projection"]["bias"].shape == (16,)
  snippet = ("import jax\nfrom avtext import runs\n"
             f"print(runs.load_run({str(blown_up[0])!r}).step)\n")
  jobs = [("another model", "avtext.main",
           ["--config=configs/videocc_avr.py:tiny", f"--workdir={workdir}",
            "--config.model.embed_dim=24", "--config.dataset.num_eval=8"],
           (f"{workdir}/checkpoints/1: the checkpoint was not written by a model of this "
            "config: params/text_projection/bias has shape [16] there, [24] in this config",
            "resume with the config (and --config overrides) it was trained with"))]
  env = dict(user_env(tmp_path), XLA_FLAGS="--xla_force_host_platform_device_count=1")
  notebook = subprocess.Popen([sys.executable, "-c", snippet], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  failed = run_processes(jobs, env, one_line=True)
  out, err = notebook.communicate(timeout=300)
  assert not failed, "\n".join(failed)
  assert _digests_under(workdir / "checkpoints") == before
  assert not (workdir / "config.json").exists()  # this config never became the run's
  # A notebook's first JAX work (runs.load_run, JAX_PLATFORMS unset): nothing on stderr.
  assert notebook.returncode == 0 and out == "1\n" and not NOISE.search(err), err


def test_the_programs_are_quiet_on_a_cpu(blown_up, monkeypatch):
  """The blown-up run (its cache directory cannot be made) printed none of the noise; a
  cache entry JAX fails to read or write (a full disk) is no warning either, others are."""
  assert not NOISE.search(blown_up[1].stderr), blown_up[1].stderr[-3000:]
  monkeypatch.setenv("AVTEXT_COMPILATION_CACHE", str(blown_up[0].parent / "a_file" / "jax"))
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
  with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    cli.enable_compilation_cache()
    for text in ("Error writing persistent compilation cache entry for 'jit_f': OSError",
                 "Error reading persistent compilation cache entry for 'jit_f': OSError",
                 "something else"):
      warnings.warn_explicit(text, UserWarning, "compiler.py", 1, module="jax._src.compiler")
  assert [str(w.message) for w in seen] == ["something else"]
  assert "JAX_COMPILATION_CACHE_DIR" not in os.environ  # no cache where none can be


def _digests_under(directory: pathlib.Path) -> dict:
  return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
          for p in sorted(directory.rglob("*")) if p.is_file()}


# An embedder that says when the pipeline is under way (its first call, in a worker) and
# is slow enough that the run is still mining when the signal comes.
_SLOW_EMBEDDER = """import os, pathlib, time
from avtext.mining import embed
def histogram(frames):
  pathlib.Path(os.environ["MINE_STARTED"]).touch()
  time.sleep(1.0)
  return embed.colour_histogram(frames)
"""


def test_ctrl_c_or_sigterm_during_mining_is_one_line_and_keeps_the_out(tmp_path):
  corpus = tmp_path / "corpus"
  mining_corpus.write(corpus, TINY)
  (tmp_path / "slow_embedder.py").write_text(_SLOW_EMBEDDER)
  runs = {}
  for name, sig, to_group in (("ctrl_c", signal.SIGINT, True),
                              ("sigterm", signal.SIGTERM, False)):
    out = tmp_path / name
    out.mkdir()
    (out / "videocc.csv").write_text("v0,0,10000000,a red ball\n")  # an earlier run's
    (out / "dataset.json").write_text('{"csv": "videocc.csv"}\n')
    started = tmp_path / f"{name}.started"
    env = dict(user_env(tmp_path), PYTHONPATH=str(tmp_path), MINE_STARTED=str(started))
    proc = subprocess.Popen(
        [sys.executable, "-m", "avtext.mine", f"--seeds={corpus / 'seeds' / 'seeds.tsv'}",
         f"--videos={corpus / 'videos'}", "--embedder=callable:slow_embedder:histogram",
         f"--out={out}"], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, process_group=0)
    runs[name] = (proc, sig, to_group, out, started, _digests(out))
  for name, (proc, sig, to_group, out, started, before) in runs.items():
    deadline = time.monotonic() + 120
    while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
      time.sleep(0.1)
    assert started.exists(), proc.communicate()
    if to_group:  # what a terminal's Ctrl-C does
      os.killpg(proc.pid, sig)
    else:
      proc.send_signal(sig)
  for name, (proc, sig, to_group, out, started, before) in runs.items():
    stdout, stderr = proc.communicate(timeout=120)
    word = "interrupted" if sig == signal.SIGINT else "terminated"
    assert proc.returncode == 128 + sig and stdout == "", (name, proc.returncode, stderr)
    assert stderr.splitlines() == [
        f"{word} ({sig.name}): mining stopped; nothing was written to --out={out} (what it "
        "held is as it was); re-run the same command to mine again"], (name, stderr[-3000:])
    assert _digests(out) == before, name  # the staging files under _beam/ gone too
