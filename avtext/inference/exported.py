"""Jitted functions whose traced and lowered program is kept on disk between programs.

JAX's persistent compilation cache (`avtext.cli`) saves XLA's compile, but a new process
still traces the model and lowers it before it can look the compile up: for the
MiniLM text tower of `python -m avtext.search_videos` that is most of the second a
search spends in JAX. `CachedJit` keeps the lowered program as a `jax.export` artifact
under the compilation cache (<cache>/exports/), keyed by the function's name, what the
caller says identifies it (e.g. the run's model config), the arguments' tree structure,
shapes and dtypes, JAX's version and a fingerprint of avtext's source files (their
paths, sizes and modification times), so any code change makes a new one. The next
program deserializes it and calls it; its compile then hits the persistent cache.

For single-device programs (the CLIs on a laptop or one accelerator): a caller on a
mesh of several devices passes enabled=False and the function is jitted as usual. Arguments are arrays only; the outputs are
those of the jitted function.
"""
from __future__ import annotations

import functools
import hashlib
import os
import pathlib
from typing import Any, Callable

import jax

from avtext import cli


@functools.lru_cache(maxsize=1)
def source_fingerprint() -> str:
  """A hash of avtext's source files' paths, sizes and modification times."""
  root = pathlib.Path(__file__).resolve().parent.parent
  h = hashlib.sha256()
  for path in sorted(root.rglob("*.py")):
    st = path.stat()
    h.update(f"{path.relative_to(root)}|{st.st_size}|{st.st_mtime_ns}\n".encode())
  return h.hexdigest()


def exports_dir() -> pathlib.Path | None:
  root = cli.compilation_cache_dir()
  return None if root is None else pathlib.Path(root) / "exports"


class CachedJit:
  """`jax.jit(fn)` whose lowered program is saved and reused (module docstring)."""

  def __init__(self, fn: Callable[..., Any], name: str, identity: str, *,
               enabled: bool = True):
    """`enabled`: False (e.g. the caller's mesh has several devices) jits as usual."""
    self.fn, self.name, self.identity, self.enabled = fn, name, identity, enabled
    self._jit = jax.jit(fn)
    self._exported: dict[str, Any] = {}

  def _key(self, args) -> str:
    avals = [(tuple(x.shape), str(x.dtype)) for x in jax.tree.leaves(args)]
    text = "|".join([self.name, self.identity, jax.__version__, jax.default_backend(),
                     str(jax.tree.structure(args)), repr(avals), source_fingerprint()])
    return hashlib.sha256(text.encode()).hexdigest()[:32]

  def __call__(self, *args):
    directory = exports_dir()
    if directory is None or not self.enabled:
      return self._jit(*args)
    key = self._key(args)
    exported = self._exported.get(key)
    if exported is None:
      exported = self._load_or_export(directory / f"{self.name}-{key}.jaxexport", args)
      self._exported[key] = exported
    return exported.call(*args)

  def _load_or_export(self, path: pathlib.Path, args):
    from jax import export  # pylint: disable=g-import-not-at-top
    if path.exists():
      try:
        return export.deserialize(bytearray(path.read_bytes()))
      except Exception:  # pylint: disable=broad-except  (a cut-off or foreign file)
        path.unlink(missing_ok=True)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), args)
    exported = export.export(self._jit)(*abstract)
    try:
      path.parent.mkdir(parents=True, exist_ok=True)
      tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
      tmp.write_bytes(exported.serialize())
      tmp.replace(path)
    except OSError:  # a read-only or full cache only costs the next program time
      pass
    return exported
