"""Files written whole or not at all: the one way every module replaces a file.

    atomic.replace_with(path, write)    # write(tmp) fills a temporary file beside `path`,
                                        # which is then renamed over it
    atomic.write_text(path, text) / atomic.write_json(path, value, **json_dumps_kwargs)

A reader (another process, the next run after a crash or a power cut) sees the previous
version or the new one, never half of either: the temporary file sits in the same
directory (a rename within one file system is atomic), is removed when `write` raises,
and with `durable=True` (the default) the file and the rename are fsynced before the
function returns. Bulk writers of many regenerable files (the synthetic worlds) pass
`durable=False`: still never half a file, without a disk flush per file.

A failure raises OSError naming `path` and saying the previous version is unchanged.
"""
import contextlib
import json
import os
import pathlib
from typing import Any, Callable


def temporary_path(path: str | pathlib.Path) -> pathlib.Path:
  """The temporary file beside `path` this process writes first: hidden, unique to the
  process, keeping the suffix (writers that pick a format by it, such as mp4 or wav,
  still see it)."""
  path = pathlib.Path(path)
  return path.with_name(f".{path.stem}.tmp{os.getpid()}{path.suffix}")


def replace_with(path: str | pathlib.Path, write: Callable[[pathlib.Path], Any], *,
                 durable: bool = True) -> pathlib.Path:
  """Calls write(tmp) and renames tmp over `path` (module docstring); returns `path`."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = temporary_path(path)
  try:
    write(tmp)
    if durable:
      with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException as e:
    with contextlib.suppress(OSError):
      tmp.unlink()
    if isinstance(e, OSError):
      raise OSError(e.errno, f"{path}: not written ({e.strerror}); the previous version is "
                    "unchanged") from e
    raise
  if durable:
    directory = os.open(path.parent, os.O_RDONLY)
    try:
      os.fsync(directory)  # the rename itself survives a power cut
    finally:
      os.close(directory)
  return path


def write_text(path: str | pathlib.Path, text: str, *, durable: bool = True) -> pathlib.Path:
  """Replaces `path` with `text` (UTF-8) atomically."""
  return replace_with(path, lambda tmp: tmp.write_text(text, encoding="utf-8"),
                      durable=durable)


def write_bytes(path: str | pathlib.Path, data: bytes, *, durable: bool = True) -> pathlib.Path:
  """Replaces `path` with `data` atomically."""
  return replace_with(path, lambda tmp: tmp.write_bytes(data), durable=durable)


def write_json(path: str | pathlib.Path, value: Any, *, durable: bool = True,
               **dumps_kwargs) -> pathlib.Path:
  """Replaces `path` with json.dumps(value, **dumps_kwargs) atomically."""
  return write_text(path, json.dumps(value, **dumps_kwargs), durable=durable)
