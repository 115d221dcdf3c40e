"""The shared pieces of the command-line family `python -m avtext.<verb>`.

Every program defines its flags with absl in a `FlagValues` of its own (paths with
`DEFINE_path`, which expands `~`; every flag with its help text), so programs and
tests can import each other, and runs `run(main, FLAGS)`, which gives them the same
behaviour:

- `--help` (`-h`) prints the program's docstring and its flags on stdout and exits 0.
- A mistake in the inputs (a flag, the config, a path, the workdir, an index or a run:
  `avtext.errors.UserError`, a missing file) prints `error: <what is wrong and what to
  do>` on stderr, at most a few lines, and exits 2. `--debug` or AVTEXT_DEBUG=1 shows
  the traceback as well. Any other exception is a bug and keeps its traceback.
- A run that stopped short (`avtext.errors.RunStopped`: an evaluator failed, a loss
  went non-finite, SIGINT or SIGTERM during training or mining) prints its one line and
  exits with its own status (1; 130 / 143); Ctrl-C anywhere else prints `interrupted`
  and exits 130.
- JAX's persistent compilation cache is on (see `compilation_cache_dir`), so running a
  program again does not recompile what it compiled last time.
- With libtpu installed (the default venv: it AOT-compiles for TPUs) on a machine
  without TPU chips, JAX is told not to try the TPU backend, whose failed start
  prints a dozen lines of libtpu warnings at every run.
"""
from __future__ import annotations

import ast
import difflib
import importlib.util
import logging
import os
import pathlib
import re
import sys
import traceback
from typing import Callable
import warnings

from absl import app
from absl import flags
from absl import logging as absl_logging

from avtext import errors

DEBUG_ENV = "AVTEXT_DEBUG"
CACHE_ENV = "AVTEXT_COMPILATION_CACHE"  # a directory, or "off"
# Set when `quiet_tpu_probe` chose JAX_PLATFORMS, so main can still say why it runs on CPU.
AUTO_PLATFORMS_ENV = "AVTEXT_JAX_PLATFORMS_AUTO"
USER_ERRORS = (errors.UserError, FileNotFoundError, NotADirectoryError, IsADirectoryError,
               FileExistsError, PermissionError)


def expand(path: str | None) -> str | None:
  """`~` and `~user` expanded (bash does not after `--flag=`); None stays None."""
  return os.path.expanduser(path) if path else path


class _PathParser(flags.ArgumentParser):
  syntactic_help = "a path (~ is expanded)"

  def parse(self, argument):
    return expand(str(argument))

  def flag_type(self):
    return "path"


def DEFINE_path(name: str, default: str | None, help: str, **kwargs):  # pylint: disable=invalid-name,redefined-builtin
  """A string flag that holds a path, with `~` expanded."""
  return flags.DEFINE(_PathParser(), name, default, help, serializer=flags.ArgumentSerializer(),
                      **kwargs)


class _StepParser(flags.ArgumentParser):
  syntactic_help = "a checkpoint step N (0 or more) or 'best'"

  def parse(self, argument):
    text = str(argument).strip()
    if not (text.isdigit() or text == "best"):
      raise ValueError(f"{text!r} is no checkpoint step; pass a step number N (0 or more) or "
                       "'best', or leave --step out for the latest")
    return text

  def flag_type(self):
    return "step"


def DEFINE_checkpoint_step(flag_values: flags.FlagValues,  # pylint: disable=invalid-name
                           help: str = "its checkpoint: N, 'best' or the latest (default)",  # pylint: disable=redefined-builtin
                           name: str = "step"):
  """`--step` (or `--<name>` for a program that opens several runs) of a program that
  opens a run (`avtext.runs.load_run`'s `step`): the string N or 'best', anything else
  refused when the flags are parsed."""
  return flags.DEFINE(_StepParser(), name, None, help, flag_values=flag_values)


def parse_step(step: str | None) -> int | str | None:
  """--step's value as `avtext.runs.load_run` takes it: N, 'best' or None (latest)."""
  return int(step) if step and step.isdigit() else step


def _remote(path: str) -> bool:
  return "://" in str(path)


def check_input_file(flag: str, path: str, what: str = "file") -> None:
  """--flag=path must be a readable file (a remote path is left to its reader)."""
  if _remote(path):
    return
  if not os.path.exists(path):
    raise errors.InputNotFound(f"--{flag}={path}: no such {what}")
  if os.path.isdir(path):
    raise errors.BadInput(f"--{flag}={path}: a directory, not a {what}; give the {what}")
  if not os.access(path, os.R_OK):
    raise errors.BadInput(f"--{flag}={path}: not readable (permission denied); fix its "
                          "permissions or give another")


def check_input_dir(flag: str, path: str, what: str = "directory") -> None:
  """--flag=path must be a readable directory (a remote path is left to its reader)."""
  if _remote(path):
    return
  if not os.path.exists(path):
    raise errors.InputNotFound(f"--{flag}={path}: no such directory")
  if not os.path.isdir(path):
    raise errors.BadInput(f"--{flag}={path}: a file, not a directory; give the {what}")
  if not os.access(path, os.R_OK | os.X_OK):
    raise errors.BadInput(f"--{flag}={path}: not readable (permission denied); fix its "
                          "permissions or give another")


def check_output_dir(flag: str, path: str) -> None:
  """--flag=path names an output directory: refused before any work when it is a file, or
  when it (or, not there yet, the nearest directory above it) cannot be written."""
  if _remote(path):
    return
  target = pathlib.Path(path).absolute()
  if target.exists() and not target.is_dir():
    raise errors.BadInput(f"--{flag}={path}: a file, not a directory; give a directory "
                          "(created when missing)")
  probe = target
  while not probe.exists():
    probe = probe.parent
  if not probe.is_dir():
    raise errors.BadInput(f"--{flag}={path}: {probe} is a file, so no directory can be made "
                          "under it; give another path")
  if not os.access(probe, os.W_OK | os.X_OK):
    raise errors.BadInput(f"--{flag}={path}: {probe} is not writable (permission denied); "
                          "give a directory you can write")


def read_lines(flag: str, path: str, what: str, whats: str) -> list[str]:
  """The non-empty lines of the text file --flag=path, stripped (checked first with
  `check_input_file`); a file that is not UTF-8 text (a binary file, a video given by
  mistake) or holds no line is one errors.BadInput naming the flag and what a line is
  (`what`, plural `whats`)."""
  check_input_file(flag, path)
  try:
    with open(path, encoding="utf-8") as f:
      lines = [line.strip() for line in f if line.strip()]
  except UnicodeDecodeError as e:
    raise errors.BadInput(f"--{flag}={path}: not a text file (not UTF-8); "
                          f"expected one {what} per line") from None
  if not lines:
    raise errors.BadInput(f"--{flag}={path}: no {whats} in it; expected one {what} per line")
  return lines


def check_range(flag: str, value, low=None, high=None, *, why: str = "") -> None:
  """--flag=value must lie in [low, high] (either bound None: open)."""
  if value is None:
    return
  if (low is not None and value < low) or (high is not None and value > high):
    bounds = (f"in [{low}, {high}]" if low is not None and high is not None
              else f">= {low}" if low is not None else f"<= {high}")
    raise errors.BadInput(f"--{flag}={value}: must be {bounds}{'; ' + why if why else ''}")


def note_cut(what: str, tokens: int, kept: int, limit: str) -> None:
  """One line on stderr saying an input was cut: `what` is `tokens` tokens long, only
  the first `kept` are used (`limit` names what sets that)."""
  print(f"note: {what} is {tokens} tokens long; only its first {kept} are used ({limit}); "
        "shorten it to search all of it", file=sys.stderr)


def cache_dir(env: str, name: str) -> str | None:
  """A cache directory: the environment variable `env` (a directory, or "off"), else
  $XDG_CACHE_HOME/avtext/<name> (~/.cache/avtext/<name>)."""
  value = os.environ.get(env)
  if value == "off":
    return None
  if value:
    return expand(value)
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "avtext", name)


def compilation_cache_dir() -> str | None:
  """JAX's persistent compilation cache: AVTEXT_COMPILATION_CACHE (a directory, or
  "off"), else ~/.cache/avtext/jax."""
  return cache_dir(CACHE_ENV, "jax")


def enable_compilation_cache() -> None:
  """Points JAX at the cache through its environment (read when jax is imported);
  entries for every compilation over 0.2 s. A JAX_COMPILATION_CACHE_DIR already set wins.

  A cache only saves time, so one that cannot be used is no cache rather than a warning
  at every compilation: a directory that cannot be made or written is left out, and
  JAX's "Error reading / writing persistent compilation cache entry" warning (one entry
  a full disk or another process broke) is dropped."""
  warnings.filterwarnings("ignore", message=_CACHE_ENTRY_ERROR, category=UserWarning,
                          module=r"jax\._src\.compiler")
  path = compilation_cache_dir()
  if path is None or "JAX_COMPILATION_CACHE_DIR" in os.environ:
    return
  try:
    os.makedirs(path, exist_ok=True)
  except OSError:
    return
  if not os.access(path, os.W_OK | os.X_OK):
    return
  os.environ["JAX_COMPILATION_CACHE_DIR"] = path
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
  if "jax" in sys.modules:  # already imported (by the program's imports): set it directly
    import jax  # pylint: disable=g-import-not-at-top
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs",
                      float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))


_CACHE_ENTRY_ERROR = r"Error (reading|writing) persistent compilation cache entry"


def _has_tpu_chips() -> bool:
  dev = pathlib.Path("/dev")
  return any(dev.glob("accel[0-9]*")) or any(dev.glob("vfio/[0-9]*"))


def quiet_tpu_probe() -> None:
  """With libtpu installed and no TPU chips here, JAX_PLATFORMS without "tpu" (and
  without "cuda" when no NVIDIA driver is here either). Programs call it at start-up
  (`run`), `avtext.runs.load_run` for notebooks; a jax imported already is told too,
  unless its backends have started."""
  if os.environ.get("JAX_PLATFORMS") or importlib.util.find_spec("libtpu") is None:
    return
  if _has_tpu_chips():
    return
  gpu = (importlib.util.find_spec("jax_cuda12_plugin") is not None
         and os.path.exists("/dev/nvidiactl"))
  os.environ["JAX_PLATFORMS"] = "cuda,cpu" if gpu else "cpu"
  os.environ[AUTO_PLATFORMS_ENV] = "1"
  if "jax" in sys.modules:  # read when jax was imported: set it directly
    from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
    if not xla_bridge.backends_are_initialized():
      sys.modules["jax"].config.update("jax_platforms", os.environ["JAX_PLATFORMS"])


# XLA:CPU's default scheduler lets one device start a collective of a program while
# the others are still in an earlier one; with N fake CPU devices
# (--xla_force_host_platform_device_count) the devices' threads can then all wait in
# two different rendezvous and the process aborts after 40 s ("Termination timeout for
# `all gather ...`": the tiny XML step, run twice in one process, did every time).
SAFE_CPU_SCHEDULER = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def safe_cpu_collectives() -> None:
  """Adds SAFE_CPU_SCHEDULER to XLA_FLAGS when they ask for several CPU devices (read
  when the first backend starts: call it before any computation). A flag that already
  names the scheduler wins."""
  flags_now = os.environ.get("XLA_FLAGS", "")
  devices = re.search(r"--xla_force_host_platform_device_count=(\d+)", flags_now)
  if (devices and int(devices.group(1)) > 1
      and "xla_cpu_enable_concurrency_optimized_scheduler" not in flags_now):
    os.environ["XLA_FLAGS"] = f"{flags_now} {SAFE_CPU_SCHEDULER}".strip()


class QuietLibraries(logging.Filter):
  """Drops INFO chatter of checkpointing internals; warnings still pass.

  A failed save is reported once, by the trainer (checkpointing.CheckpointSaveError):
  the tracebacks orbax's save threads log for it, and asyncio's for each array write
  they leave unfinished (thousands of lines on a full disk), are dropped.
  """

  def filter(self, record):
    if "/orbax/" in record.pathname:
      return record.levelno >= logging.WARNING and not record.exc_info
    return not (record.name == "asyncio" and record.levelno >= logging.ERROR)


def log_progress() -> None:
  """A program's own progress (absl INFO) on stderr, without the libraries' INFO
  chatter (`QuietLibraries`): main, and the programs that write features."""
  absl_logging.set_verbosity(absl_logging.INFO)
  handler = absl_logging.get_absl_handler()
  if not any(isinstance(f, QuietLibraries) for f in handler.filters):
    handler.addFilter(QuietLibraries())


def _program() -> str:
  main_module = sys.modules.get("__main__")
  spec = getattr(main_module, "__spec__", None)
  if spec is not None and spec.name:
    name = spec.name[:-len(".__main__")] if spec.name.endswith(".__main__") else spec.name
    return f"python -m {name}"
  return os.path.basename(sys.argv[0]) if sys.argv else "avtext"


def _print_help(program: str, doc: str | None, flag_values: flags.FlagValues) -> None:
  print((doc or "").strip() or program)
  print(f"\nflags of {program}:")
  for name in sorted(flag_values):
    flag = flag_values[name]
    if name != flag.name:  # a short name
      continue
    default = "" if flag.default is None else f" (default: {flag.default_as_str})"
    print(f"  --{flag.name}: {flag.help}{default}")
  print("  --debug: show the traceback of an input error, too (or AVTEXT_DEBUG=1)")


def unknown_flag_message(name: str, program: str, flag_values: flags.FlagValues,
                         also: tuple[str, ...] = ()) -> str:
  """"unknown flag --name (did you mean --x?); see <program> --help"."""
  known = [n for n in flag_values if len(n) > 1] + list(also)
  close = difflib.get_close_matches(name, known, n=1)
  hint = f" (did you mean --{close[0]}?)" if close else ""
  return f"unknown flag --{name}{hint}; see {program} --help"


def parse_flags(argv: list[str], program: str, flag_values: flags.FlagValues,
                known_only: bool = False) -> list[str]:
  """absl's parsing into `flag_values` (values of an earlier parse dropped), with
  one-line errors (UserError) instead of absl's FATAL text; returns the positional
  arguments, argv[0] first (with `known_only`, the flags it does not know too)."""
  flag_values.unparse_flags()
  try:
    return flag_values(argv, known_only=known_only)
  except flags.UnrecognizedFlagError as e:
    raise errors.BadInput(unknown_flag_message(e.flagname, program, flag_values)) from None
  except flags.Error as e:
    text = str(e)
    if "Traceback (most recent call last)" in text:  # a config file's get_config raised
      flag = text.split(": ")[0]
      last = [line.strip() for line in text.splitlines() if line.strip()][-1]
      last = last.split(": ", 1)[1] if re.match(r"^\w+(Error|Exception): ", last) else last
      raise errors.BadInput(f"{flag}: {last}") from None
    unset = re.search(r"Type <class 'NoneType'> of field (config[\w.]*) is not supported", text)
    if unset:  # ml_collections types a value by the field's default, and None has no type
      given = next((a for a in argv if a.startswith(f"--{unset.group(1)}=")),
                   f"--{unset.group(1)}")
      raise errors.BadInput(f"{given}: the config leaves this field unset (None), so no value "
                            "can be given on the command line; set it in the config file (or "
                            "pick a variant that sets it)") from None
    raise errors.BadInput(f"{e}; see {program} --help") from None
  except Exception as e:  # pylint: disable=broad-except
    # A flag's own parser failed, e.g. ml_collections applying --config.<field>=<value>.
    overrides = [a.split("=")[0] for a in argv[1:] if a.startswith("--") and "." in
                 a.split("=")[0]]
    which = f"{' / '.join(overrides)}: " if overrides else ""
    raise errors.BadInput(f"{which}{exception_message(e)}; see {program} --help") from None


def exception_message(error: BaseException) -> str:
  """The innermost cause's message on one line, without the repr quoting KeyError and
  ml_collections add (its "Did you mean" hint comes through)."""
  chain = [error]
  while chain[-1].__cause__ is not None or chain[-1].__context__ is not None:
    chain.append(chain[-1].__cause__ or chain[-1].__context__)
  text = next((str(e) for e in chain if "Did you mean" in str(e)), str(chain[-1]))
  for _ in range(2):
    if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":
      try:
        text = str(ast.literal_eval(text))
      except (ValueError, SyntaxError):
        break
  return " ".join(line.strip() for line in text.splitlines() if line.strip())


def check_config_file(flag: str, source: str) -> None:
  """--flag=source (path[:variant]) must name a config file: a missing one (with the
  closest name in its folder) or a directory is one UserError, before it is loaded."""
  path = source.split(":")[0]
  if os.path.isdir(path):
    raise errors.BadInput(f"--{flag}={source}: a directory, not a config file; give "
                          f"{os.path.join(path, '<experiment>.py')}[:variant]")
  if not os.path.exists(path):
    folder = os.path.dirname(path) or "."
    known = sorted(p for p in os.listdir(folder) if p.endswith(".py")) if os.path.isdir(
        folder) else []
    close = difflib.get_close_matches(os.path.basename(path), known, n=1)
    hint = (f" (did you mean {os.path.join(folder, close[0])}?)" if close else
            f"; {folder}/ has {', '.join(known)}" if known else "")
    raise errors.InputNotFound(f"--{flag}={source}: no such file{hint}")


def config_value(holder) -> object:
  """The ConfigDict of a `config_flags.DEFINE_config_file` flag (None when left out), or
  one UserError naming what is wrong with the file (`check_config_file`) or an override
  (ml_collections raises while loading)."""
  flag = holder._flagvalues[holder.name]  # pylint: disable=protected-access
  if flag.present:  # (a flag left out has no file name to ask for)
    check_config_file(holder.name, flag.config_filename)
  try:
    config = holder.value
  except Exception as e:  # pylint: disable=broad-except
    raise errors.BadInput(f"--{holder.name}: {exception_message(e)}") from e
  return expand_config_paths(config)


def expand_config_paths(config):
  """`config` with every string field that starts with ~ expanded (paths given as
  --config.dataset.path=~/data: bash does not expand after =); returns it (None, for an
  optional config flag left out, stays None)."""
  if config is None:
    return None
  for key in list(config.keys()):
    value = config[key]
    if isinstance(value, str) and value.startswith("~"):
      config[key] = os.path.expanduser(value)
    elif hasattr(value, "keys") and not isinstance(value, str):
      expand_config_paths(value)
  return config


def debug_requested(argv: list[str]) -> bool:
  return "--debug" in argv or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def report(error: BaseException, program: str) -> None:
  """`error: <message>` on stderr (the message's own lines, at most 6)."""
  text = str(error).strip()
  if isinstance(error, FileNotFoundError) and error.filename and error.strerror:
    text = f"{error.filename}: {error.strerror}"
  lines = text.splitlines() or [type(error).__name__]
  if len(lines) > 6:
    lines = lines[:5] + [f"... ({len(lines) - 5} more lines with --debug)"]
  print(f"error: {lines[0]}", file=sys.stderr)
  for line in lines[1:]:
    print(f"  {line}", file=sys.stderr)


def run(main: Callable[[list[str]], object], flag_values: flags.FlagValues,
        argv: list[str] | None = None, *, doc: str | None = None,
        known_only: bool = False) -> None:
  """Runs `main(args)` as an avtext program: parses `argv` (default sys.argv) into the
  program's own `flag_values`, then calls main with the positional arguments
  (args[0]: the program). Returns when main does; exits 0 after --help, 2 on a user
  error, a RunStopped's status when a run stops short (module docstring). Tests call
  it in-process with their own argv. `known_only`: flags the program does not define go
  to main with the positional arguments (a program that passes them on, e.g. Beam's
  options, checks them itself)."""
  argv = list(sys.argv if argv is None else argv)
  program = _program() if argv[0] == sys.argv[0] else argv[0]
  if doc is None:
    doc = getattr(sys.modules.get("__main__"), "__doc__", None)
  if any(a in ("-h", "--help", "--helpshort", "--helpfull", "-?") for a in argv[1:]):
    _print_help(program, doc, flag_values)
    sys.exit(0)
  debug = debug_requested(argv)
  argv = [a for a in argv if a != "--debug"]
  quiet_tpu_probe()
  safe_cpu_collectives()
  enable_compilation_cache()
  if not flags.FLAGS.is_parsed():  # absl's own (logging) flags keep their defaults
    flags.FLAGS.mark_as_parsed()
  absl_logging.use_absl_handler()  # as absl's app.run: its format, main's filters
  try:
    args = parse_flags(argv, program, flag_values, known_only)
    try:
      main([program] + args[1:])
    except app.UsageError as e:
      raise errors.BadInput(f"{e}; see {program} --help") from None
  except USER_ERRORS as e:
    if debug:
      traceback.print_exc()
    report(e, program)
    sys.exit(2)
  except errors.RunStopped as e:
    if debug:
      traceback.print_exc()
    print(f"{e.prefix}{e}", file=sys.stderr)
    sys.exit(e.exit_code)
  except KeyboardInterrupt:
    if debug:
      traceback.print_exc()
    print("interrupted", file=sys.stderr)
    if _joined_a_job():  # a second Ctrl-C: the others will find this process lost
      exit_now(130)
    sys.exit(130)


def _joined_a_job() -> bool:
  """Whether this process joined a multi-process job (jax.distributed.initialize)."""
  if "jax" not in sys.modules:
    return False
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  return distributed.global_state.client is not None


def exit_now(code: int) -> None:
  """Exits without atexit handlers (from any thread): JAX's shutdown barrier would wait
  for a process that is gone (or leaving), then abort with a stack."""
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)  # pylint: disable=protected-access
