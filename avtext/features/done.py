"""DONE markers: a feature directory finished with the same arguments is reused.

A build writes its arguments to `<out>/DONE` once every file is in place
(`mark_finished`); a later build with the same arguments returns at once
(`reuse_finished`), any other clears the marker first, so an interrupted build
is never taken for a finished one.
"""
import json
import pathlib

from absl import logging

from avtext.train import rundir


def reuse_finished(out: pathlib.Path, args: dict, force: bool) -> bool:
  """True when `out` holds a build finished with `args` (its DONE marker); else clears the mark."""
  done = pathlib.Path(out) / "DONE"
  if not force and done.is_file() and json.loads(done.read_text()) == args:
    logging.info("%s is complete; reusing it (--force rebuilds)", out)
    return True
  done.unlink(missing_ok=True)
  return False


def mark_finished(out: pathlib.Path, args: dict) -> None:
  rundir.write_json(pathlib.Path(out) / "DONE", args)
