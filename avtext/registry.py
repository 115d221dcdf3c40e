"""The name -> class or factory tables behind every config string: `config.task`,
`config.model.name`, `config.evals.<name>.type` and `config.dataset.name`.

Entries register themselves with a decorator in their own module. A registry
knows which modules hold its entries and imports them on the first lookup, so a
config string alone selects the code: either all of them (`modules` a sequence:
tasks, models, evaluators) or only the one a name needs (`modules` a mapping
name -> module: datasets, so that e.g. TensorFlow is imported only by a config
that reads TFDS files). A prefix entry (`register(name, prefix=True)`, e.g.
'tfds:') takes every longer name that starts with it and that no exact entry
claims.
"""
import importlib
from typing import Any, Callable, Mapping, Sequence

DEFAULT_MESSAGE = "{where}={name!r}; registered {kind}s: {names}"


class Registry:
  """One table: `register(name)` decorates, `get(name, where=...)` looks up.

  Args:
    kind: what an entry is ("task", "model", ...), for messages.
    modules: the modules whose import registers the entries: a sequence (all
      imported on the first lookup) or a mapping name -> module (each imported
      when its name is looked up).
    prefix_modules: prefix -> module, for prefix entries of a mapping registry.
    message: the unknown-name error, formatted with where, name, kind, names
      (a list) and joined (the names, comma-separated).
  """

  def __init__(self, kind: str, modules: Sequence[str] | Mapping[str, str], *,
               prefix_modules: Mapping[str, str] | None = None,
               message: str = DEFAULT_MESSAGE):
    self.kind = kind
    self._lazy = dict(modules) if isinstance(modules, Mapping) else None
    self._modules = () if self._lazy is not None else tuple(modules)
    self._prefix_modules = dict(prefix_modules or {})
    self._message = message
    self._entries: dict[str, Any] = {}
    self._prefixes: dict[str, Any] = {}

  def register(self, name: str, *, prefix: bool = False) -> Callable[[Any], Any]:
    """Decorator: `entry` answers `name` (with `prefix`: every longer name after it).

    Registering the same entry again (a module re-imported by `importlib.reload`)
    replaces it; a different entry under a taken name is an error.
    """
    table = self._prefixes if prefix else self._entries

    def decorate(entry):
      old = table.get(name)
      if old is not None and _qualname(old) != _qualname(entry):
        raise ValueError(f"{self.kind} {name!r} is already registered by {_qualname(old)}")
      table[name] = entry
      return entry
    return decorate

  def names(self) -> list[str]:
    """Every name a config can use; prefix families as '<prefix><name>'."""
    for module in self._modules:
      importlib.import_module(module)
    exact = sorted(set(self._entries) | set(self._lazy or ()))
    prefixes = set(self._prefixes) | set(self._prefix_modules)
    return exact + sorted(f"{p}<name>" for p in prefixes)

  def get(self, name: str | None, *, where: str) -> Any:
    """The entry `name`; `where` names the config field in the error."""
    for module in self._modules:
      importlib.import_module(module)
    if name and name not in self._entries and name in (self._lazy or {}):
      self._import(self._lazy[name], name, self._entries)
    if name in self._entries:
      return self._entries[name]
    for prefix, module in self._prefix_modules.items():
      if name and name.startswith(prefix) and prefix not in self._prefixes:
        self._import(module, prefix, self._prefixes)
    for prefix, entry in self._prefixes.items():
      if name and name.startswith(prefix) and len(name) > len(prefix):
        return entry
    names = self.names()
    raise ValueError(self._message.format(where=where, name=name, kind=self.kind, names=names,
                                          joined=", ".join(names)))

  def snapshot(self) -> tuple[dict, dict]:
    """The registrations as they are now; `restore` puts them back (tests)."""
    return dict(self._entries), dict(self._prefixes)

  def restore(self, snapshot: tuple[dict, dict]) -> None:
    self._entries, self._prefixes = dict(snapshot[0]), dict(snapshot[1])

  def _import(self, module: str, name: str, table: dict) -> None:
    importlib.import_module(module)
    if name not in table:
      raise ImportError(f"{module} was imported to register {self.kind} {name!r} but did not "
                        "register it (missing its register decorator?)")


def _qualname(entry: Any) -> str:
  return f"{getattr(entry, '__module__', '?')}.{getattr(entry, '__qualname__', repr(entry))}"
