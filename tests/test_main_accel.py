"""Accelerator installs and main's CPU guard (docs/scale.md "Run on a TPU pod" / "Run on GPUs").

- `python -m avtext.main` refuses, in seconds and with one line, to train a config
  whose config.target_topology names an accelerator slice when JAX finds only CPU
  devices (tests/conftest.py sets JAX_PLATFORMS=cpu, which the subprocesses inherit),
  and trains it with --allow_cpu; --require_backend (the launch/ scripts) refuses too.
- setup.py's tpu / cuda12 / dev extras are exactly the pins of requirements-*.txt.
- `make venv ACCEL=...` installs the right files and reinstalls when the set changes
  (`make -n` against a stamp in tmp_path, so .venv is never touched).
"""
import importlib.metadata
import os
import pathlib
import runpy
import shutil
import subprocess
import sys
import time

from packaging.requirements import Requirement
import pytest
import setuptools

REPO = pathlib.Path(__file__).resolve().parents[1]
TOPOLOGY = "v5e:2x2"

# The tiny AVR config plus a target_topology, as a config file of its own: the tiny
# variant leaves the field None (or lacks it), and a None field cannot be set by flag.
_CONFIG = f'''
import sys
sys.path.insert(0, {str(REPO)!r})
from configs import videocc_avr


def get_config():
  config = videocc_avr.get_config("tiny")
  config.target_topology = {TOPOLOGY!r}
  return config
'''


def _main(*args, devices=1, timeout=120):
  """(returncode, stdout + stderr, seconds) of `python -m avtext.main ARGS` on CPU."""
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  start = time.perf_counter()
  proc = subprocess.run([sys.executable, "-m", "avtext.main", *args], cwd=REPO, env=env,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                        timeout=timeout, check=False)
  return proc.returncode, proc.stdout, time.perf_counter() - start


@pytest.fixture(name="topology_config")
def _topology_config(tmp_path):
  path = tmp_path / "tiny_on_tpu.py"
  path.write_text(_CONFIG)
  return path


def test_main_refuses_a_targeted_config_on_cpu(topology_config, tmp_path):
  workdir = tmp_path / "run"
  rc, out, seconds = _main(f"--config={topology_config}", f"--workdir={workdir}",
                           timeout=60)
  assert rc != 0, out
  assert seconds < 20, seconds  # before the task, its data or any compile
  assert "Traceback" not in out, out
  line, = [l for l in out.splitlines() if "(config.target_topology)" in l]
  assert line.startswith(f"error: {topology_config} targets TPU {TOPOLOGY} (config.target_topology) "
                         "but JAX finds only CPU devices (JAX_PLATFORMS=cpu)"), line
  for hint in ("make venv ACCEL=tpu|cuda12", "--allow_cpu", ":demo"):
    assert hint in line, line
  # The platform was logged before the refusal; nothing was written.
  assert "JAX " in out and " on cpu: 1 devices (1 on this process), kind cpu; process 0 of 1" in out
  assert not workdir.exists()


def test_require_backend_refuses_cpu(tmp_path):
  # What the launch/ scripts pass; a config without target_topology, in eval mode too.
  rc, out, seconds = _main("--config=configs/videocc_avr.py:tiny", f"--workdir={tmp_path}",
                           "--mode=eval", "--require_backend=gpu", timeout=60)
  assert rc != 0 and seconds < 20, (rc, seconds, out)
  assert "Traceback" not in out, out
  assert "--require_backend=gpu but JAX runs on cpu (JAX_PLATFORMS=cpu)" in out, out


def test_paper_config_refused_on_cpu(tmp_path):
  """The paper VideoCC config, once it names its slice, is refused the same way."""
  sys.path.insert(0, str(REPO))
  try:
    from configs import videocc_avr  # pylint: disable=g-import-not-at-top
  finally:
    sys.path.remove(str(REPO))
  topology = videocc_avr.get_config().get("target_topology")
  if not topology:
    pytest.skip("configs/videocc_avr.py sets no config.target_topology")
  rc, out, _ = _main("--config=configs/videocc_avr.py", f"--workdir={tmp_path / 'run'}",
                     timeout=60)
  assert rc != 0, out
  assert f"configs/videocc_avr.py targets TPU {topology} (config.target_topology)" in out, out
  # Demo variants leave it None, so `make demo` is unaffected.
  assert not videocc_avr.get_config("demo").get("target_topology")


@pytest.mark.slow  # `make test-slow` (CI runs it): the default run's 12-minute budget
@pytest.mark.timeout(300)
def test_allow_cpu_trains(topology_config, tmp_path):
  """--allow_cpu passes the guard: the run gets to its training loop (then is stopped)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
  proc = subprocess.Popen(
      [sys.executable, "-u", "-m", "avtext.main", f"--config={topology_config}",
       f"--workdir={tmp_path / 'run'}", "--allow_cpu", "--config.train.num_steps=1"],
      cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  out = []
  try:
    for line in proc.stdout:
      out.append(line)
      # The trainer's first line of the loop; compiling and evaluating would take
      # as long again. Should its wording change, the run just goes to the end.
      if "training steps 0 -> 1" in line:
        break
  finally:
    if proc.poll() is None:
      proc.terminate()
    rest, _ = proc.communicate(timeout=120)
    out = "".join(out) + rest
  assert "training steps 0 -> 1" in out or proc.returncode == 0, out[-3000:]
  assert f"targets TPU {TOPOLOGY} (config.target_topology); training on CPU devices anyway " \
         "(--allow_cpu)" in out, out[-3000:]


def _requirement_lines(name):
  lines = [line.split("#", 1)[0].strip() for line in (REPO / name).read_text().splitlines()]
  return [line for line in lines if line]


def _setup_kwargs(monkeypatch):
  captured = {}
  monkeypatch.setattr(setuptools, "setup", lambda **kwargs: captured.update(kwargs))
  monkeypatch.chdir(REPO)
  runpy.run_path(str(REPO / "setup.py"), run_name="__main__")
  return captured


@pytest.mark.parametrize("extra,path", [("tpu", "requirements-tpu.txt"),
                                        ("cuda12", "requirements-cuda12.txt"),
                                        ("dev", "requirements-dev.txt")])
def test_setup_extras_are_the_requirement_files(monkeypatch, extra, path):
  extras = _setup_kwargs(monkeypatch)["extras_require"]
  lines = _requirement_lines(path)
  assert extras[extra] == lines
  for line in lines:  # exact pins only
    spec, = Requirement(line).specifier
    assert spec.operator == "==" and "*" not in spec.version, line


def test_accelerator_pins_match_jax():
  """libtpu is the one jax's `tpu` extra allows; the CUDA plugin is jax's own version."""
  jax_version = importlib.metadata.version("jax")
  lines = _requirement_lines("requirements-tpu.txt") + _requirement_lines(
      "requirements-cuda12.txt")
  pins = {Requirement(line).name: Requirement(line) for line in lines}
  tpu_extra = [Requirement(r) for r in importlib.metadata.requires("jax")
               if 'extra == "tpu"' in r]
  libtpu, = [r for r in tpu_extra if r.name == "libtpu"]
  pinned, = pins["libtpu"].specifier
  assert libtpu.specifier.contains(pinned.version), (libtpu, pinned)
  for name in ("jax-cuda12-plugin", "jax-cuda12-pjrt"):
    assert str(pins[name].specifier) == f"=={jax_version}", pins[name]
  assert pins["jax-cuda12-plugin"].extras == {"with-cuda"}


# make's own variables out: under `make test` a nested make would print "Entering directory".
_MAKE_ENV = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}


def _make_n(venv, *args):
  proc = subprocess.run(["make", "-n", "venv", f"VENV={venv}", *args], cwd=REPO,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                        check=False, timeout=60, env=_MAKE_ENV)
  return proc.returncode, proc.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_venv_accel(tmp_path):
  venv = tmp_path / "venv"
  venv.mkdir()
  stamp = venv / ".installed"

  def install_line(out):
    line, = [l for l in out.splitlines() if "pip install" in l and "requirements.lock" in l]
    return line

  # A fresh venv: the default set is the lock + libtpu, never CUDA; cpu and tpu agree.
  for accel in ((), ("ACCEL=cpu",), ("ACCEL=tpu",)):
    rc, out = _make_n(venv, *accel)
    assert rc == 0, out
    line = install_line(out)
    assert "-r requirements-tpu.txt" in line and "cuda12" not in line, line
    assert f"echo cpu > {stamp}" in out
  rc, out = _make_n(venv, "ACCEL=cuda12")
  assert "-r requirements-tpu.txt -r requirements-cuda12.txt" in install_line(out), out
  assert f"echo cuda12 > {stamp}" in out
  assert "uninstall" not in out

  # An up-to-date cuda12 venv stays as it is when no ACCEL is given ...
  stamp.write_text("cuda12\n")
  rc, out = _make_n(venv)
  assert rc == 0 and "Nothing to be done" in out, out
  # ... and ACCEL=cpu reinstalls without (and uninstalls) the CUDA wheels.
  rc, out = _make_n(venv, "ACCEL=cpu")
  assert "pip uninstall" in out and "-r requirements-cuda12.txt" in out, out
  assert "cuda12" not in install_line(out)
  # A default venv: tpu is the same set; cuda12 reinstalls.
  stamp.write_text("cpu\n")
  assert "Nothing to be done" in _make_n(venv, "ACCEL=tpu")[1]
  assert "requirements-cuda12.txt" in install_line(_make_n(venv, "ACCEL=cuda12")[1])
  # A changed pin file reinstalls the same set.
  os.utime(stamp, (0, 0))
  assert "cuda12" not in install_line(_make_n(venv)[1])

  rc, out = _make_n(venv, "ACCEL=rocm")
  assert rc != 0 and "ACCEL=rocm: expected cpu" in out, out


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_venv_checks_the_python_and_rebuilds_another_ones_venv(tmp_path):
  """PYTHON is checked before a venv is made (one line naming PYTHON=, nothing created);
  a venv whose python is another version, or runs no more, is removed and made again."""
  py310 = tmp_path / "python3.10"  # answers the version question as Python 3.10 does
  py310.write_text("#!/bin/sh\necho 3.10\n")
  py310.chmod(0o755)
  fresh = tmp_path / "fresh"
  proc = subprocess.run(["make", "venv", f"VENV={fresh}", f"PYTHON={py310}"], cwd=REPO,
                        capture_output=True, text=True, check=False, timeout=60,
                        env=_MAKE_ENV)
  assert proc.returncode != 0 and not fresh.exists(), proc
  assert proc.stdout == "" and len(proc.stderr.splitlines()) == 1, proc.stderr
  assert (f"PYTHON={py310} is Python 3.10, not Python 3.11" in proc.stderr
          and "make venv PYTHON=python3.11" in proc.stderr), proc.stderr
  # A venv of Python 3.10, installed and up to date: rebuilt with this Python 3.11.
  old = tmp_path / "old"
  (old / "bin").mkdir(parents=True)
  shutil.copy(py310, old / "bin" / "python")
  (old / ".installed").write_text("cpu\n")
  rc, out = _make_n(old, f"PYTHON={sys.executable}")
  assert rc == 0, out
  lines = out.splitlines()
  assert lines[0] == (f'echo "{old} was made by Python 3.10; rebuilding it with Python 3.11 '
                      f'({sys.executable})" && rm -rf {old}'), out
  assert lines[1] == f"test -x {old}/bin/python || {sys.executable} -m venv {old}", out
  (old / "bin" / "python").unlink()  # its interpreter gone
  assert "has no Python that runs; rebuilding it" in _make_n(old)[1]
  # A venv of this Python is left as it is, whatever PYTHON says.
  (old / "bin" / "python").symlink_to(sys.executable)
  rc, out = _make_n(old, f"PYTHON={py310}")
  assert rc == 0 and "Nothing to be done" in out, out
