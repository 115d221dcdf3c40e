"""A run directory's one writer and its small files.

One process writes a run directory (`--workdir`) at a time: training, or
`--mode=eval` writing its results into the run. The writer holds `lock(workdir)`,
an exclusive `flock` on `workdir/run.lock`, taken before anything is written; the
file names the owner (host, pid, start time, command). A second writer stops at
once with `RunLockedError`, one line naming that owner. The OS drops a flock when
its process dies, however it dies, so a killed run never leaves its directory
locked: the next writer finds the dead owner's name still in the file, logs that it
takes over, and writes its own. Readers (`avtext.runs`, notebooks, `--mode=eval`
into another directory) take no lock and need no write access.

Small state files (`results.json`, `config.json`) are replaced whole: written to a
temporary file beside them, fsync'd, then renamed over the old one (atomic on
POSIX), so a reader, a killed writer or a full disk leaves the old file or the new
one, never half of one. `read_json` names the file when it cannot be parsed.
"""
import contextlib
import datetime
import errno
import fcntl
import json
import os
import pathlib
import socket
import sys
from typing import Any, Iterator

from absl import logging
import ml_collections

from avtext import atomic
from avtext import errors

LOCK_FILE = "run.lock"
RESULTS_FILE = "results.json"
CONFIG_FILE = "config.json"
# The checkpoint directories (`checkpointing`, which imports orbax, re-exports them).
LATEST_DIR = "checkpoints"
BEST_DIR = "best_checkpoints"
CHECKSUMS = "checksums.json"  # in each step directory, once the checkpoint is sealed
# What to do about a config.json that does not parse: every reader says the same.
CONFIG_FIX = ("if the directory holds the run of your config, delete that file and re-run "
              "the training command, which rewrites it (--mode=eval: pass --config); else "
              "pick another --workdir")

_held: dict[str, int] = {}  # locked directory -> nesting depth, in this process
_fds: dict[str, int] = {}  # locked directory -> the open lock file holding the flock


class RunLockedError(RuntimeError):
  """Another live process is writing the run directory."""


class RunFileError(errors.BadInput):
  """A run file exists but cannot be parsed (its message names the file and the fix)."""


@contextlib.contextmanager
def lock(workdir: str | pathlib.Path, *, process_index: int = 0) -> Iterator[None]:
  """Holds `workdir`'s writer lock for the `with` block; creates `workdir`.

  The trainer takes it (`Trainer.train`, `Trainer.evaluate`), for `main`, tests and
  notebooks alike; re-entrant within a process. In a multi-process run only process 0
  writes run files, so only it locks; the others get a no-op. Raises RunLockedError
  (one line naming the owner) when another live process holds it, OSError when
  `workdir` cannot be written.
  """
  if process_index != 0:
    yield
    return
  workdir = pathlib.Path(workdir).absolute()
  workdir.mkdir(parents=True, exist_ok=True)
  key = os.path.realpath(workdir)
  if key not in _held:
    _fds[key] = _acquire(workdir / LOCK_FILE)
  _held[key] = _held.get(key, 0) + 1
  try:
    yield
  finally:
    _held[key] -= 1
    if not _held[key]:
      del _held[key]
      _release(workdir / LOCK_FILE, _fds.pop(key))


@contextlib.contextmanager
def output_lock(path: str | pathlib.Path, flag: str) -> Iterator[None]:
  """`lock` on a program's output directory (`--flag`: an index, mined clips, features, a
  materialized dataset), so two processes never write one output; the second stops with
  `errors.WorkdirInUse` naming the flag and the owner. A directory the lock created and
  nothing was written to is removed again."""
  path = pathlib.Path(path)
  created = not path.exists()
  with contextlib.ExitStack() as stack:
    if created:  # runs last, once the lock file is gone
      stack.callback(_remove_if_empty, path)
    try:
      stack.enter_context(lock(path))
    except RunLockedError as e:
      raise errors.WorkdirInUse(f"--{flag}={path}: {e}") from None
    yield


def _remove_if_empty(path: pathlib.Path) -> None:
  with contextlib.suppress(OSError):
    path.rmdir()  # fails, as it should, when anything is in it


def has_checkpoint(workdir: str | pathlib.Path) -> bool:
  """Whether the run holds a checkpoint step directory (latest or best); no orbax read."""
  return any(d.name.isdigit() for sub in (LATEST_DIR, BEST_DIR)
             if (pathlib.Path(workdir) / sub).is_dir()
             for d in (pathlib.Path(workdir) / sub).iterdir())


def no_best_reason(workdir: str | pathlib.Path, config: ml_collections.ConfigDict) -> str | None:
  """Why the run of `config` in `workdir` holds no best checkpoint (`--step=best`), or None
  when it holds one; reads only the run's directory listing and results.json."""
  workdir = pathlib.Path(workdir)
  best = workdir / BEST_DIR
  if best.is_dir() and any(d.name.isdigit() for d in best.iterdir()):
    return None
  select = (config.get("eval") or {}).get("select")
  if not select:
    return "it selects none (config.eval.select is unset)"
  metric, evaluator = select[0], select[0].split("/")[0]
  path = workdir / RESULTS_FILE
  results = read_json(path, fix="delete it; evaluating writes it again") if path.is_file() else {}
  if any(key.startswith(f"{evaluator}/") for step in results.values() if isinstance(step, dict)
         for key in step):
    return (f"its evaluator {evaluator!r} ran but never gave {metric!r}, the "
            "config.eval.select metric (a split without references gives no score)")
  return f"no evaluation of {metric!r} (config.eval.select) has finished yet"


def check_free(workdir: str | pathlib.Path) -> None:
  """Raises RunLockedError, as `lock` would, when a live process holds `workdir`'s lock;
  creates nothing (`main` asks before it validates the rest; the trainer then takes the
  lock)."""
  path = pathlib.Path(workdir).absolute() / LOCK_FILE
  if os.path.realpath(path.parent) in _held:
    return
  try:
    fd = os.open(path, os.O_RDONLY)
  except OSError:  # no lock file (or no directory): nobody holds it
    return
  try:
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
  except BlockingIOError:
    owner = _read_owner(fd)
    raise RunLockedError(
        f"{path.parent} is in use by {_describe(owner, path)}; only one run may write it: "
        "wait for that one to finish or stop it, then re-run") from None
  except OSError:
    pass
  finally:
    os.close(fd)


def _acquire(path: pathlib.Path) -> int:
  while True:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      owner = _read_owner(fd)
      os.close(fd)
      raise RunLockedError(
          f"{path.parent} is in use by {_describe(owner, path)}; only one run may write it: "
          "wait for that one to finish or stop it, then re-run") from None
    except OSError as e:
      if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
        os.close(fd)
        raise
      logging.warning("%s: this filesystem refuses file locks (%s); nothing stops a second "
                      "launch from writing the same run", path, e.strerror)
      break
    # The previous owner removes the file when it releases it: a flock taken on a file
    # it removed in between (no longer at `path`) locks nothing.
    with contextlib.suppress(FileNotFoundError):
      if os.fstat(fd).st_ino == os.stat(path).st_ino:
        break
    os.close(fd)
  if previous := _read_owner(fd):
    logging.warning("%s: taking over from %s, which is no longer running", path,
                    _describe(previous, path))
  me = {"host": socket.gethostname(), "pid": os.getpid(),
        "since": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join(sys.argv)}
  os.ftruncate(fd, 0)
  os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
  os.fsync(fd)
  return fd


def _release(path: pathlib.Path, fd: int) -> None:
  with contextlib.suppress(FileNotFoundError):
    path.unlink()  # while still locked, so no one takes the lock on a file about to go
  os.close(fd)  # drops the flock


def _read_owner(fd: int) -> dict:
  try:
    return json.loads(os.pread(fd, 4096, 0).decode() or "{}")
  except ValueError:  # cut off by a crash while it was being written
    return {}


def _describe(owner: dict, path: pathlib.Path) -> str:
  if not owner:
    return f"a process that has not yet written its name into {path}"
  return f"pid {owner.get('pid')} on {owner.get('host')} since {owner.get('since')}"


def write_json(path: str | pathlib.Path, value: Any) -> None:
  """A run file (results.json, config.json, ...): indented, sorted keys, written atomically."""
  atomic.write_json(path, value, indent=2, sort_keys=True)


def read_json(path: str | pathlib.Path, *, fix: str) -> Any:
  """The parsed contents of `path`; RunFileError naming it and `fix` when unparseable."""
  path = pathlib.Path(path)
  try:
    return json.loads(path.read_text(encoding="utf-8"))
  except (ValueError, UnicodeDecodeError) as e:
    raise RunFileError(f"{path}: not valid JSON ({e}); {fix}") from None


# ---- the run's identity: its config.json (`main` refuses a workdir of another run)
# Sections of a config that are objects (ConfigDicts) whenever config.json has them.
_CONFIG_SECTIONS = ("model", "dataset", "data", "train", "eval", "evals", "optimizer", "loss")


def read_config(path: str | pathlib.Path) -> ml_collections.ConfigDict:
  """A run's config.json as a ConfigDict; RunFileError naming the file, the first field of
  the wrong shape and the fix when it is not a config."""
  value = read_json(path, fix=CONFIG_FIX)
  wrong = ("the whole file" if not isinstance(value, dict) else
           "'task'" if not isinstance(value.get("task"), str) else
           next((repr(k) for k in _CONFIG_SECTIONS if k in value
                 and not isinstance(value[k], dict)), None))
  if wrong:
    raise RunFileError(f"{path}: valid JSON but not an avtext config ({wrong} is not what "
                       "a config holds there: an object with a 'task' string and objects "
                       f"for {', '.join(_CONFIG_SECTIONS)}); {CONFIG_FIX}")
  return ml_collections.ConfigDict(value)


def _flat(tree, prefix=""):
  if isinstance(tree, dict):
    out = {}
    for k, v in tree.items():
      out.update(_flat(v, f"{prefix}{k}."))
    return out
  return {prefix[:-1]: tree}


# Model fields that say where a run was traced, not what it trains: a run resumes on
# another backend (`config.model.backend`, recorded when the task is built).
_NOT_IDENTITY = ("model.backend",)


def identity(config: ml_collections.ConfigDict) -> dict:
  """What makes a run directory's checkpoints this config's: the task and every
  `config.model` field but `_NOT_IDENTITY`, as config.json stores them."""
  as_json = json.loads(config.to_json_best_effort())
  fields = {"task": as_json.get("task"), **_flat(as_json.get("model") or {}, "model.")}
  return {k: v for k, v in fields.items() if k not in _NOT_IDENTITY}


def check_workdir(config: ml_collections.ConfigDict, workdir: str | pathlib.Path,
                  source: str = "this command") -> None:
  """Raises `errors.WorkdirInUse` when `workdir`'s config.json (the run's identity)
  names another task or model than `config`; a workdir without one is free."""
  path = pathlib.Path(workdir) / CONFIG_FILE
  if not path.exists():
    return
  theirs = identity(read_config(path))
  ours = identity(config)
  differ = [k for k in sorted(set(ours) & set(theirs)) if ours[k] != theirs[k]]
  if not differ:
    return
  def show(values):
    return ", ".join(f"{k}={values[k]!r}" for k in differ[:3]) + (
        f" (+{len(differ) - 3} more)" if len(differ) > 3 else "")
  raise errors.WorkdirInUse(
      f"--workdir {workdir} holds another run: its config.json has {show(theirs)}; "
      f"{source} has {show(ours)}. Pick another --workdir (or delete that one to start over)")
