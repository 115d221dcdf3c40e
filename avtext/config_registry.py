"""The name -> class or factory tables behind every config string: `config.task`,
`config.model.name`, `config.evals.<name>.type` and `config.dataset.name`.

An entry registers itself with its registry's decorator in its own module, e.g.
`@register_model("bert")`; adding one is adding that file. A registry knows its
packages (its own, and those other installed distributions declare under the entry-point
group `avtext.<kind>s`, e.g. `[avtext.datasets] name = package`: datasets and worlds
that live outside avtext) and reads (without importing) their modules for the decorator
calls, so it knows every name a config can use, and imports a module only when
one of its names is looked up: a config string alone selects the code, and e.g.
TensorFlow is imported only by a config that reads TFDS files. A prefix entry
(`register(name, prefix=True)`, e.g. 'tfds:') takes every longer name that
starts with it and that no exact entry claims.
"""
import ast
import importlib
import importlib.metadata
import importlib.util
import pathlib
from typing import Any, Callable

DEFAULT_MESSAGE = "{where}={name!r}; registered {kind}s: {names}"


class Registry:
  """One table: `register(name)` decorates, `get(name, where=...)` looks up.

  Args:
    kind: what an entry is ("task", "model", ...), for messages.
    package: the package whose modules register the entries ("avtext.models"), or a
      tuple of packages, read in order (a name registered in two is the first's); the
      packages or modules of the entry-point group `avtext.<kind>s` (`plugins`) are
      read after them.
    decorator: the name the modules call to register ("register_model"); a call
      `<x>.<decorator>("name", ...)` or `<decorator>("name", ...)` with a string
      first argument is an entry of that module.
    message: the unknown-name error, formatted with where, name, kind, names
      (a list) and joined (the names, comma-separated).
  """

  def __init__(self, kind: str, package: str | tuple[str, ...], decorator: str, *,
               message: str = DEFAULT_MESSAGE):
    self.kind = kind
    self.packages = (package,) if isinstance(package, str) else tuple(package)
    self.decorator = decorator
    self._message = message
    self._entries: dict[str, Any] = {}
    self._prefixes: dict[str, Any] = {}
    self._found: tuple[dict[str, str], dict[str, str]] | None = None

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
    exact, prefixes = self._modules()
    return (sorted(set(self._entries) | set(exact))
            + sorted(f"{p}<name>" for p in set(self._prefixes) | set(prefixes)))

  def get(self, name: str | None, *, where: str) -> Any:
    """The entry `name`; `where` names the config field in the error."""
    exact, prefixes = self._modules()
    if name and name not in self._entries and name in exact:
      self._import(exact[name], name, self._entries)
    if name in self._entries:
      return self._entries[name]
    for prefix, module in prefixes.items():
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

  def plugins(self) -> tuple[str, ...]:
    """The packages or modules installed distributions add to this registry: the values
    of the entry-point group `avtext.<kind>s` (setup.py's entry_points), sorted; one
    that is not importable here is left out."""
    points = importlib.metadata.entry_points(group=f"avtext.{self.kind}s")
    return tuple(sorted({p.value for p in points if _findable(p.value)}))

  def _modules(self) -> tuple[dict[str, str], dict[str, str]]:
    """({name: module}, {prefix: module}) of the packages' register calls, read once."""
    if self._found is None:
      exact, prefixes = {}, {}
      for package in self.packages + self.plugins():
        spec = importlib.util.find_spec(package)
        paths = (sorted(pathlib.Path(spec.origin).parent.glob("*.py"))
                 if spec.submodule_search_locations else [pathlib.Path(spec.origin)])
        for path in paths:
          module = (package if path.stem == "__init__" or not spec.submodule_search_locations
                    else f"{package}.{path.stem}")
          for name, prefix in _register_calls(path, self.decorator):
            (prefixes if prefix else exact).setdefault(name, module)
      self._found = exact, prefixes
    return self._found

  def _import(self, module: str, name: str, table: dict) -> None:
    importlib.import_module(module)
    if name not in table:
      raise ImportError(f"{module} was imported to register {self.kind} {name!r} but did not "
                        f"register it (its {self.decorator} call did not run)")


def _register_calls(path: pathlib.Path, decorator: str) -> list[tuple[str, bool]]:
  """[(name, prefix)] of the `decorator("name", prefix=...)` calls in `path`."""
  found = []
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if not isinstance(node, ast.Call) or not node.args:
      continue
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    first = node.args[0]
    if called == decorator and isinstance(first, ast.Constant) and isinstance(first.value, str):
      prefix = any(k.arg == "prefix" and isinstance(k.value, ast.Constant) and k.value.value
                   for k in node.keywords)
      found.append((first.value, prefix))
  return found


def _findable(name: str) -> bool:
  try:
    return importlib.util.find_spec(name) is not None
  except ImportError:  # a parent package that is not there
    return False


def _qualname(entry: Any) -> str:
  return f"{getattr(entry, '__module__', '?')}.{getattr(entry, '__qualname__', repr(entry))}"
