"""The package's floors: every import of `avtext` runs down, none runs in a circle.

The floors, ground first (docs/architecture.md). A module may import modules of
its own package and of any lower floor; packages that share a floor do not import
each other. Imports inside functions count too: a lazy import that runs back up a
floor is still a dependency the lower floor cannot be read without.

The synthetic world (`avtext.data.synthetic`) is a data source like any other: outside
it, only the tools that write its files (`WORLD_WRITERS`) import it; evaluators, tasks,
mining and builders ask a source for its ground truth (`avtext.data.ground_truth`).
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
    ("registry", "ops", "modalities", "assets", "cli"),  # tables, array helpers, asset
                                                         # paths, the CLIs' shared pieces
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
WORLD = "avtext.data.synthetic"
WORLD_WRITERS = ("avtext.tools.coot_synthetic", "avtext.tools.mining_world",
                 "avtext.tools.synthetic_layout", "avtext.tools.tvr_synthetic")


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


def _imports(module: str, path: pathlib.Path, known: set[str]) -> set[str]:
  """Every avtext module `module` imports, at top level or inside a function."""
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
  return found


def _graph(root: pathlib.Path = ROOT) -> dict[str, set[str]]:
  modules = _modules(root)
  return {m: _imports(m, p, set(modules)) for m, p in modules.items()}


def _in_world(module: str) -> bool:
  return module == WORLD or module.startswith(WORLD + ".")


def _world_imports(graph: dict[str, set[str]]) -> list[str]:
  """'<module> imports <world module>' for every import of the synthetic world from
  outside it, the world writers excepted."""
  return [f"{module} imports {other}" for module, imported in sorted(graph.items())
          if not _in_world(module) and module not in WORLD_WRITERS
          for other in sorted(imported) if _in_world(other)]


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
  for module, imported in sorted(_graph().items()):
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


def test_only_the_world_writers_import_the_synthetic_world():
  assert _world_imports(_graph()) == [], (
      "ask the source for its ground truth (avtext.data.ground_truth) instead")


def test_the_world_rule_reports_a_planted_import(tmp_path):
  """The rule itself: a lazy import of the world in an evaluator is reported; the world's
  own modules and a world writer may import it."""
  files = {"avtext/__init__.py": "",
           "avtext/data/__init__.py": "",
           "avtext/data/synthetic/__init__.py": "from avtext.data.synthetic import captions\n",
           "avtext/data/synthetic/captions.py": "",
           "avtext/evals/__init__.py": "",
           "avtext/evals/captioning.py": "def f():\n  from avtext.data.synthetic import captions\n",
           "avtext/evals/retrieval.py": "from avtext.data import synthetic\n",
           "avtext/tools/__init__.py": "",
           "avtext/tools/mining_world.py": "from avtext.data.synthetic import captions\n"}
  for name, text in files.items():
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text(text)
  assert _world_imports(_graph(tmp_path)) == [
      "avtext.evals.captioning imports avtext.data.synthetic.captions",
      "avtext.evals.retrieval imports avtext.data.synthetic"]


def test_world_writers_are_real_modules():
  modules = _modules()
  assert [w for w in WORLD_WRITERS if w not in modules] == []


def test_modules_over_600_lines_are_reported():
  """A warning, not a failure: ~600 lines is a reading size (STYLE: split by concept, not
  by size), so a module over it is a question to ask, never a reason to split a concept."""
  long = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py")
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
