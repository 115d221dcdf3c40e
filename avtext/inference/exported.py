"""Jitted functions whose compiled executable is kept on disk between programs.

JAX's persistent compilation cache (`avtext.cli`) saves XLA's compile, but a new process
still traces the model and lowers it before it can look the compile up: for the
MiniLM text tower of `python -m avtext.search_videos` that is most of the second a
search spends in JAX. `CachedJit` keeps the compiled executable itself
(`jax.experimental.serialize_executable`) under the compilation cache
(<cache>/exports/), keyed by the function's name, what the caller says identifies it
(e.g. the run's config), the arguments' tree structure, shapes and dtypes, JAX's
version, the device kind and the host CPU's feature flags (an executable compiled for
one CPU may not run on another), and a fingerprint of avtext's source files (their
paths, sizes and modification times), so any code change makes a new one. The next
program loads it and calls it: no tracing, lowering or compiling.

For programs on one device (the CLIs on a laptop or one accelerator): with several
devices (or enabled=False) the function is jitted as usual. Arguments are arrays only; the outputs are
those of the jitted function.
"""
from __future__ import annotations

import functools
import hashlib
import os
import pathlib
import pickle
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


@functools.lru_cache(maxsize=1)
def host_fingerprint() -> str:
  """The device kind and the CPU's feature flags (Linux /proc/cpuinfo; '' elsewhere)."""
  flags_line = ""
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      flags_line = next((line for line in f if line.startswith("flags")), "")
  except OSError:
    pass
  return f"{jax.devices()[0].device_kind}|{hashlib.sha256(flags_line.encode()).hexdigest()}"


def exports_dir() -> pathlib.Path | None:
  root = cli.compilation_cache_dir()
  return None if root is None else pathlib.Path(root) / "exports"


class CachedJit:
  """`jax.jit(fn)` whose compiled executable is saved and reused (module docstring)."""

  def __init__(self, fn: Callable[..., Any], name: str, identity: str, *,
               enabled: bool = True):
    """`enabled`: False (e.g. the caller's mesh has several devices) jits as usual."""
    self.fn, self.name, self.identity, self.enabled = fn, name, identity, enabled
    self._jit = jax.jit(fn)
    self._compiled: dict[str, Any] = {}

  def _key(self, args) -> str:
    avals = [(tuple(x.shape), str(x.dtype)) for x in jax.tree.leaves(args)]
    text = "|".join([self.name, self.identity, jax.__version__, jax.default_backend(),
                     host_fingerprint(), str(jax.tree.structure(args)), repr(avals),
                     source_fingerprint()])
    return hashlib.sha256(text.encode()).hexdigest()[:32]

  def __call__(self, *args):
    directory = exports_dir()
    if directory is None or not self.enabled or jax.device_count() != 1:
      return self._jit(*args)  # a loaded executable is bound to a single device
    key = self._key(args)
    compiled = self._compiled.get(key)
    if compiled is None:
      compiled = self._load_or_compile(directory / f"{self.name}-{key}.executable", args)
      self._compiled[key] = compiled
    return compiled(*args)

  def _load_or_compile(self, path: pathlib.Path, args):
    from jax.experimental import serialize_executable  # pylint: disable=g-import-not-at-top
    if path.exists():
      try:
        payload, in_tree, out_tree = pickle.loads(path.read_bytes())
        return serialize_executable.deserialize_and_load(payload, in_tree, out_tree)
      except Exception:  # pylint: disable=broad-except  (a cut-off or foreign file)
        path.unlink(missing_ok=True)
    compiled = self._jit.lower(*args).compile()
    try:
      path.parent.mkdir(parents=True, exist_ok=True)
      tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
      tmp.write_bytes(pickle.dumps(serialize_executable.serialize(compiled)))
      tmp.replace(path)
    except Exception:  # pylint: disable=broad-except  (unserializable, read-only, full disk)
      pass
    return compiled
