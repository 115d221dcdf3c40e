"""Errors in what the user gave (flags, config, paths, workdir, index, run).

The command-line programs (`avtext.cli.run`) print a `UserError`'s message on stderr as
is, without a traceback, and exit with status 2; `--debug` (or AVTEXT_DEBUG=1) shows
the traceback. The subclasses keep the builtin type code catches: `BadInput` is a
ValueError, `InputNotFound` a FileNotFoundError.
"""


class UserError(Exception):
  """A mistake in the command's inputs; the message says what is wrong and what to do."""


class BadInput(UserError, ValueError):
  """A value (flag, config field, file content) that cannot be used."""


class InputNotFound(UserError, FileNotFoundError):
  """A file or directory the command was pointed at does not exist or is incomplete."""


class WorkdirInUse(UserError):
  """The run directory holds another run, or another process runs in it."""


class RunStopped(Exception):
  """A run that stopped short for a reason its one-line message gives, with what it kept
  and what to do (not a mistake in the inputs): `avtext.cli.run` prints `prefix` +
  message on stderr, without a traceback unless --debug, and exits with `exit_code`."""
  exit_code = 1
  prefix = "error: "


class NothingProduced(RunStopped):
  """The command ran but its result is empty (every input skipped, no clip mined, no
  file captioned): the message says why and where the record of the skips is."""


class EvaluationFailed(RunStopped):
  """An evaluator raised; the message names it and the step, and says what is on disk."""


class Interrupted(RunStopped):
  """SIGINT / SIGTERM: stopped at a step boundary with its checkpoint saved. Exit status
  128 + the signal's number, as a shell reports a process the signal ended (130, 143)."""
  prefix = ""

  def __init__(self, message: str, signum: int):
    super().__init__(message)
    self.exit_code = 128 + int(signum)

