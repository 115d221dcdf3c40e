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
