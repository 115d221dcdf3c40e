"""Name -> class or factory tables behind `config.task`, `config.model.name`
and `config.evals.<name>.type` (datasets have their own, with prefixes:
`avtext.data.builders`).

Entries register themselves with a decorator in their own module; the modules
listed for a registry are imported on its first lookup, so a config string
alone selects the code.
"""
import importlib
from typing import Any, Callable, Sequence


class Registry:
  """One table: `register(name)` decorates, `get(name, where=...)` looks up."""

  def __init__(self, kind: str, modules: Sequence[str]):
    self.kind = kind
    self.modules = tuple(modules)
    self._entries: dict[str, Any] = {}

  def register(self, name: str) -> Callable[[Any], Any]:
    def deco(entry):
      old = self._entries.get(name)
      if old is not None and old is not entry:
        raise ValueError(f"{self.kind} {name!r} registered twice")
      self._entries[name] = entry
      return entry
    return deco

  def names(self) -> list[str]:
    for module in self.modules:
      importlib.import_module(module)
    return sorted(self._entries)

  def get(self, name: str | None, *, where: str) -> Any:
    """The entry `name`; `where` names the config field in the error."""
    names = self.names()
    if not name or name not in self._entries:
      raise ValueError(f"{where}={name!r}; registered {self.kind}s: {names}")
    return self._entries[name]
