"""The package's floors: every import of `avtext` runs down, none runs in a circle.

The floors, ground first (docs/architecture.md). A module may import modules of
its own package and of any lower floor; packages that share a floor do not import
each other. Imports inside functions count too: a lazy import that runs back up a
floor is still a dependency the lower floor cannot be read without.

The demos' procedural world is a package beside avtext (`avworld`): it imports avtext,
and avtext learns of it only through its registries' entry points (setup.py), so no
module of avtext imports it, loads it by a string (a registry's packages, importlib) or
names it; evaluators, tasks, mining and builders ask a source for its ground truth
(`avtext.data.ground_truth`), and the evaluators, the oracle protocols, the builders and
the feature extractors (`NEUTRAL`) name none of its attributes (`WORLD_WORDS`).
Registries load modules by string: those edges count for the floors too.
"""
import ast
import collections
import pathlib
import warnings

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "avtext"

FLOORS = (
    ("errors", "atomic"),  # the user-error types every layer raises; files replaced
                           # whole or not at all
    ("config_registry", "ops", "modalities", "assets", "cli"),  # tables, array helpers,
                                                                # asset paths, the CLIs'
                                                                # shared pieces
    ("text",),       # tokenizers and vocabularies
    ("data",),       # reading, decoding and sampling examples; the synthetic world
    ("metrics",),    # pure numpy/jax scores
    ("inference",),  # decoding, span search, ANN
    ("losses",),     # jitted pure loss functions, one name table per family
    ("models",),     # flax.linen modules
    ("weights",),    # pretrained and official checkpoints -> model variables
    ("tasks",),      # model + loss + data contract of each system
    ("train",),      # the one trainer, checkpoints, meshes
    ("runs",),       # opening a run directory: config + model + variables
    ("evals",),      # evaluators over the tasks' declared protocols
    ("experiment",),  # one config -> task + evaluators + trainer
    ("main", "aot", "import_checkpoint", "materialize"),  # train / eval / compile a config,
    # import an official checkpoint, store a dataset as TFDS
    ("features",),   # running a model to write feature files
    ("tools",),      # one-off converters and CLIs (checkpoint import, vocab, TVR eval)
    ("mining",),     # the VideoCC mining pipeline
    ("index",),      # own-video index
    ("search_videos", "search_moments", "caption", "mine"),  # the user-facing CLIs above them
    ("serve",),      # the local web page over the search and caption CLIs' libraries
)
MAX_LINES = 600
# Names of a paper or system, one module each in the parallel packages (models, tasks,
# losses, metrics, evals, weights, data builders, features, inference).
PER_PAPER = frozenset({"bert", "captioning", "classification", "coot", "gpt2", "mmt",
                       "retrieval", "smit", "vcmr", "xml"})
WORLD = "avworld"
NEUTRAL = ("evals", "data/builders", "data/ground_truth.py", "features")  # under avtext/
# Words of the world those modules must not use in a name, an attribute, an argument or a
# string (docstrings too), and config keys only the world reads (config.dataset.world,
# .get("world"), ["world"]).
WORLD_WORDS = ("synthetic", "mentions_sound", WORLD)
WORLD_KEYS = ("world",)
# Calls that load a module named by a string: the name's argument (position, keyword).
LOADERS = {"Registry": (1, "package"), "import_module": (0, "name"),
           "find_spec": (0, "name"), "__import__": (0, "name")}


def _floor_of() -> dict[str, int]:
  return {name: i for i, names in enumerate(FLOORS) for name in names}


def _modules(root: pathlib.Path = ROOT) -> dict[str, pathlib.Path]:
  out = {}
  for path in sorted((root / "avtext").rglob("*.py")):
    parts = path.relative_to(root).with_suffix("").parts
    if parts[-1] == "__init__":
      parts = parts[:-1]
    out[".".join(parts)] = path
  return out


def _string_loads(path: pathlib.Path) -> list[str]:
  """The module names `path` loads by string: a registry's packages
  (`Registry(kind, package, decorator)`) and importlib's argument."""
  found = []
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if not isinstance(node, ast.Call):
      continue
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if called not in LOADERS:
      continue
    index, keyword = LOADERS[called]
    arg = (node.args[index] if len(node.args) > index else
           next((k.value for k in node.keywords if k.arg == keyword), None))
    parts = [] if arg is None else [arg, *getattr(arg, "elts", ())]  # a name or a tuple
    found += [c.value for c in parts if isinstance(c, ast.Constant) and isinstance(c.value, str)]
  return found


def _imports(module: str, path: pathlib.Path, known: set[str], *,
             strings: bool = False) -> set[str]:
  """Every avtext module `module` imports, at top level or inside a function; with
  `strings`, also those it loads by string (`_string_loads`: a registry's packages)."""
  package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
  found = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
      # `from a import b`: the submodule a.b where b is one, else a itself.
      names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    else:
      continue
    for name in names:
      if name.split(".")[0] != "avtext":
        continue
      while name and name not in known:  # `import a.b.func`-style tails -> a.b
        name = name.rpartition(".")[0]
      if name and name != module:
        found.add(name)
  if strings:
    found |= {name for name in _string_loads(path) if name in known and name != module}
  return found


def _graph(root: pathlib.Path = ROOT, *, strings: bool = False) -> dict[str, set[str]]:
  modules = _modules(root)
  return {m: _imports(m, p, set(modules), strings=strings) for m, p in modules.items()}


def _in_world(name: str) -> bool:
  return name == WORLD or name.startswith(WORLD + ".")


def _world_uses(root: pathlib.Path = ROOT) -> list[str]:
  """Every way an avtext module reaches the world: an import of it, a string load of it
  (a registry's packages, importlib), or a string load of an avtext module that does not
  exist (e.g. the world's old home, avtext.data.synthetic)."""
  modules = _modules(root)
  found = []
  for module, path in modules.items():
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
               [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
               else [])
      found += [f"{module} imports {n}" for n in names if _in_world(n)]
    for name in _string_loads(path):
      if _in_world(name):
        found.append(f"{module} loads {name} by string")
      elif name.split(".")[0] == "avtext" and name not in modules:
        found.append(f"{module} loads {name} by string, which is no avtext module")
  return sorted(found)


def _world_words(path: pathlib.Path) -> list[tuple[int, str]]:
  """(line, word) for each name, attribute, argument or string (docstrings too) in
  `path` that holds one of `WORLD_WORDS`, and each read of a config key in `WORLD_KEYS`
  (an attribute, a `.get` or a subscript)."""
  found = []
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    key = (node.attr if isinstance(node, ast.Attribute) else
           node.slice.value if isinstance(node, ast.Subscript)
           and isinstance(node.slice, ast.Constant) else
           node.args[0].value if isinstance(node, ast.Call) and node.args
           and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
           and isinstance(node.args[0], ast.Constant) else None)
    if key in WORLD_KEYS:
      found.append((node.lineno, key))
    text = (node.id if isinstance(node, ast.Name) else
            node.attr if isinstance(node, ast.Attribute) else
            node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else
            node.name if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                           ast.ClassDef)) else
            node.arg if isinstance(node, (ast.arg, ast.keyword)) else None)
    if not text:
      continue
    found += [(node.lineno, w) for w in WORLD_WORDS if w in text.lower()]
  return found


def _neutral_words(root: pathlib.Path = ROOT) -> list[str]:
  """'<file>:<line> names <word>' for every world word in the `NEUTRAL` modules."""
  paths = []
  for place in NEUTRAL:
    where = root / "avtext" / place
    paths += [where] if where.suffix == ".py" else sorted(where.rglob("*.py"))
  return [f"{p.relative_to(root)}:{line} names {word!r}" for p in paths if p.exists()
          for line, word in _world_words(p)]


def _room(module: str) -> str:
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else ""


def test_every_package_has_a_floor():
  floors = _floor_of()
  rooms = {_room(m) for m in _modules()} - {""}
  assert sorted(rooms - set(floors)) == [], "new packages need a floor in FLOORS (and docs/architecture.md)"


def test_imports_run_down_the_floors():
  floors = _floor_of()
  wrong = []
  for module, imported in sorted(_graph(strings=True).items()):
    here = _room(module)
    for other in sorted(imported):
      there = _room(other)
      if here in ("", there) or there == "":
        continue
      if floors.get(there, -1) >= floors.get(here, -1):
        wrong.append(f"{module} (floor {floors.get(here)}) imports {other} "
                     f"(floor {floors.get(there)})")
  assert wrong == []


def test_no_import_circles():
  graph = _graph()
  # Tarjan's strongly connected components; any component of 2+ modules is a circle.
  index, low, on_stack, stack, circles = {}, {}, set(), [], []
  counter = [0]

  def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on_stack.add(v)
    for w in graph.get(v, ()):
      if w not in graph:
        continue
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        circles.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  assert circles == []


def test_avtext_reaches_the_world_only_through_entry_points():
  assert _world_uses() == [], (
      "avtext learns of the world through setup.py's entry points (avtext.config_registry); "
      "ask a source for its ground truth (avtext.data.ground_truth)")


def test_avtext_never_names_the_world():
  named = [str(p.relative_to(ROOT)) for p in sorted(PACKAGE.rglob("*.py"))
           if WORLD in p.read_text()]
  assert named == []


def test_evaluators_builders_and_extractors_name_no_world_attribute():
  assert _neutral_words() == [], (
      "declare what the evaluator needs in a protocol (avtext.data.ground_truth, "
      "avtext.evals.protocols) and let the world's sources answer it")


def test_the_world_rules_report_planted_uses(tmp_path):
  """The rules themselves: a registry string that loads the world (or its old home
  inside avtext), an importlib string and a lazy import are each reported."""
  files = {"avtext/__init__.py": "",
           "avtext/config_registry.py": "class Registry: ...\n",
           "avtext/data/__init__.py": "",
           "avtext/data/builders/__init__.py": (
               "from avtext import config_registry\nDATASETS = config_registry.Registry(\n"
               "    'dataset', ('avtext.data.builders', 'avworld'), 'register_dataset')\n"),
           "avtext/data/ground_truth.py": (
               "from avtext import config_registry\nWORLDS = config_registry.Registry("
               "'world', package='avtext.data.synthetic', decorator='register_world')\n"),
           "avtext/evals/__init__.py": "",
           "avtext/evals/captioning.py": "def f():\n  from avworld import captions\n",
           "avtext/evals/retrieval.py": ("import importlib\n"
                                         "importlib.import_module('avworld.datasets')\n"),
           "avworld/__init__.py": "from avworld import captions\n",
           "avworld/captions.py": "from avtext import config_registry\n"}
  for name, text in files.items():
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text(text)
  assert _world_uses(tmp_path) == [
      "avtext.data.builders loads avworld by string",
      "avtext.data.ground_truth loads avtext.data.synthetic by string, which is no avtext "
      "module",
      "avtext.evals.captioning imports avworld",
      "avtext.evals.retrieval loads avworld.datasets by string"]


def test_the_neutral_rule_reports_planted_world_attributes(tmp_path):
  """The rule itself, on copies of the real retrieval evaluator and tower extractor: the
  world's sound flag read back into the evaluator and its config key read by the
  extractor are reported; the real files are not."""
  plants = {"evals/retrieval.py": ("\n\ndef _sound(oracle, n):\n"
                                   "  return [oracle.describe(i)['mentions_sound'] "
                                   "for i in range(n)]\n"),
            "features/tower.py": "\n\ndef _frames(run):\n  return run.config.dataset.world\n"}
  for name, plant in plants.items():
    real = PACKAGE / name
    copy = tmp_path / "avtext" / name
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(real.read_text() + plant)
    assert _world_words(real) == []
  lines = {name: len((PACKAGE / name).read_text().splitlines()) for name in plants}
  assert _neutral_words(tmp_path) == [
      f"avtext/evals/retrieval.py:{lines['evals/retrieval.py'] + 4} names 'mentions_sound'",
      f"avtext/features/tower.py:{lines['features/tower.py'] + 4} names 'world'"]


def test_module_names_are_unique():
  """A module's file name says which file it is; a paper's or system's name repeats across
  the parallel packages by design (docs/architecture.md, "Where a paper lives")."""
  by_name = collections.defaultdict(list)
  for path in PACKAGE.rglob("*.py"):
    if path.stem not in ("__init__", "__main__") and path.stem not in PER_PAPER:
      by_name[path.stem].append(str(path.relative_to(ROOT)))
  assert {n: sorted(p) for n, p in by_name.items() if len(p) > 1} == {}


def test_modules_over_600_lines_are_reported():
  """A warning, not a failure: ~600 lines is a reading size (STYLE: split by concept, not
  by size), so a module over it is a question to ask, never a reason to split a concept."""
  long = {str(p.relative_to(ROOT)): n
          for p in [*PACKAGE.rglob("*.py"), *(ROOT / WORLD).rglob("*.py")]
          if (n := len(p.read_text().splitlines())) > MAX_LINES}
  if long:
    warnings.warn(f"modules over {MAX_LINES} lines (split one if it holds two concepts): "
                  + ", ".join(f"{p} {n} (+{n - MAX_LINES})" for p, n in sorted(long.items())))


def test_the_walker_sees_lazy_and_relative_imports(tmp_path):
  """The checker itself: a function-level import and a relative import are edges."""
  pkg = tmp_path / "avtext" / "a"
  pkg.mkdir(parents=True)
  (pkg / "__init__.py").write_text("")
  (pkg / "x.py").write_text("def f():\n  from avtext.b import y\n")
  (pkg / "z.py").write_text("from . import x\n")
  known = {"avtext.a", "avtext.a.x", "avtext.a.z", "avtext.b", "avtext.b.y"}
  assert _imports("avtext.a.x", pkg / "x.py", known) == {"avtext.b.y"}
  assert _imports("avtext.a.z", pkg / "z.py", known) == {"avtext.a.x"}


@pytest.mark.parametrize("floor", range(len(FLOORS)))
def test_floors_name_real_packages(floor):
  modules = _modules()
  for name in FLOORS[floor]:
    assert any(m == f"avtext.{name}" or m.startswith(f"avtext.{name}.") for m in modules), (
        f"FLOORS names avtext.{name}, which does not exist")


def test_configs_share_code_through_the_configs_package_only(tmp_path):
  """configs/common.py holds the shared helpers; no config edits sys.path, and the
  configs import from any working directory (setup.py installs the package)."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  configs = ROOT / "configs"
  offenders = [p.name for p in configs.glob("*.py") if "sys.path" in p.read_text()]
  assert not offenders, f"configs editing sys.path: {offenders}"
  code = ("from configs import coot_youcook2, smit_spoken_amm, videocc_caption; "
          "print(coot_youcook2.get_config('tiny').task, "
          "smit_spoken_amm.get_config('tiny').task, videocc_caption.get_config('tiny').task)")
  proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.split() == ["coot", "smit", "captioning"]


def test_configs_use_the_documented_top_level_nodes():
  """Every config, in each of its variants, names its top-level nodes from the scheme in
  docs/architecture.md ("The config's nodes"), and that table names no node none uses."""
  import importlib  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top
  text = (ROOT / "docs" / "architecture.md").read_text()
  table = text.split("### The config's nodes", 1)[1].split("\n\n", 3)[2]
  documented = {name.split(".")[0] for row in table.splitlines()[2:]
                for name in re.findall(r"`([a-z_.<>]+)`", row.split("|")[1])}
  used, wrong = set(), []
  for path in sorted((ROOT / "configs").glob("*.py")):
    if path.stem in ("__init__", "common"):
      continue
    module = importlib.import_module(f"configs.{path.stem}")
    with pytest.raises(ValueError, match="unknown variant") as known:  # names the variants
      module.get_config("no_such_variant")
    for variant in [None] + re.findall(r"'(\w+)'", str(known.value).rsplit("subset of", 1)[1]):
      try:
        config = module.get_config(variant)
      except ValueError:  # a variant that goes only with another one (asr: demo,asr)
        config = module.get_config(f"demo,{variant}")
      nodes = set(config.keys())
      used |= nodes
      wrong += [f"{path.name}:{variant} {n}" for n in sorted(nodes - documented)]
  assert wrong == []
  assert sorted(documented - used - {"model_parallel"}) == []
