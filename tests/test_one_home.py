"""Each piece of knowledge has one home: readers import it, never copy it.

A scan of the package's and the configs' syntax trees finds every definition of each fact
below (a chip's figures, GIB, the compute defaults, FSDP_MIN_SIZE, TVR's clip length) and
every `raise` of each config rule's message; each must be found once, in its home. The
same scan over the sources with a copy planted in one more file finds two, so a copy
cannot slip back in.
"""
import ast
import dataclasses
import functools
import pathlib

import ml_collections
import numpy as np
import pytest

from avtext import errors
from avtext.aot import chips
from avtext.data.builders import tvc
from avtext.models import layers
from avtext.models import model_registry
from avtext.train import config_rules
from avtext.train import partitioning

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _sources() -> dict[str, str]:
  files = sorted([*(ROOT / "avtext").rglob("*.py"), *(ROOT / "configs").glob("*.py")])
  return {str(p.relative_to(ROOT)): p.read_text() for p in files}


@functools.lru_cache(maxsize=None)
def _parse(text: str) -> ast.Module:
  return ast.parse(text)


def _number(node) -> float | None:
  """The value of a numeric literal or of arithmetic on literals (2 ** 30, 80e9 / 2), else
  None."""
  try:
    value = ast.literal_eval(node) if isinstance(node, ast.Constant) else eval(  # pylint: disable=eval-used
        compile(ast.Expression(node), "<literal>", "eval"), {"__builtins__": {}})
  except Exception:  # pylint: disable=broad-except
    return None
  return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
      else None


def _assigned_names(node) -> list[str]:
  """Names (or attribute / keyword / parameter names) a node binds a value to."""
  if isinstance(node, (ast.Assign, ast.AnnAssign)):
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return [t.id if isinstance(t, ast.Name) else t.attr for t in targets
            if isinstance(t, (ast.Name, ast.Attribute))]
  if isinstance(node, ast.keyword) and node.arg:
    return [node.arg]
  return []


def _bindings(tree):
  """(name, value node) of every assignment, keyword argument and parameter default."""
  for node in ast.walk(tree):
    value = getattr(node, "value", None)
    for name in _assigned_names(node):
      if value is not None:
        yield name, value
    if isinstance(node, ast.arguments):
      params = [*node.posonlyargs, *node.args]
      for arg, default in zip(params[len(params) - len(node.defaults):], node.defaults):
        yield arg.arg, default
      for arg, default in zip(node.kwonlyargs, node.kw_defaults):
        if default is not None:
          yield arg.arg, default


def _strings(tree):
  """String literals (f-strings' literal parts too), docstrings left out."""
  docs = {id(n.body[0].value) for n in ast.walk(tree)
          if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
          and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
  for node in ast.walk(tree):
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
      yield node


# ---- the facts: each a finder of its definitions in one file's syntax tree


def _gib(tree):
  """`GIB = 2 ** 30` (or a division by 2 ** 30 written out)."""
  for name, value in _bindings(tree):
    if name.upper() == "GIB":
      yield name
  for node in ast.walk(tree):
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and _number(
        node.right) == 2 ** 30:
      yield "/ 2 ** 30"


def _fsdp_min_size(tree):
  for name, value in _bindings(tree):
    if name.lower() == "fsdp_min_size" and _number(value) is not None:
      yield name


_CLIP_LENGTH = 1.5
_NOT_THE_CLIP = ("warmup_epochs",)  # VideoCC's 1.5-epoch warmup (its config)


def _tvr_clip_length(tree):
  """The figure 1.5 (a clip length wherever it appears but where `_NOT_THE_CLIP` says), or
  a file name that spells it ("..._cl-1.5")."""
  unrelated = {id(v) for name, v in _bindings(tree) if name in _NOT_THE_CLIP}
  for node in ast.walk(tree):
    if isinstance(node, ast.Constant) and _number(node) == _CLIP_LENGTH and (
        id(node) not in unrelated):
      yield "1.5"
  for node in _strings(tree):
    if f"cl-{_CLIP_LENGTH}" in node.value:
      yield node.value


def _chip_figures():
  """Every figure of the chip table of 1e9 or more (FLOP/s, bytes/s, HBM bytes)."""
  figures = set()
  for chip in chips.CHIPS.values():
    figures.update(v for v in (chip.bf16_flops, chip.hbm_bytes_per_s, chip.ici_bytes_per_s,
                               chip.hbm_gib * chips.GIB, chip.transcendentals_per_s) if v)
  return figures


def _chip_figure(tree):
  """A number within 10 % of a chip's figure (HBM as 80e9 bytes or XLA's 84978434048, a
  bandwidth as 3.35e12 or 3352320000000), or a chip table / XLA GPU target of its own."""
  figures = _chip_figures()
  for node in ast.walk(tree):
    value = _number(node) if isinstance(node, (ast.Constant, ast.BinOp)) else None
    if value and any(abs(value - f) <= 0.1 * f for f in figures):
      yield value
    if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(
        node.func, "attr", None)) == "Chip":
      yield "Chip(...)"
  for node in _strings(tree):
    if "device_memory_size" in node.value:
      yield "an XLA GPU target"


_COMPUTE_DEFAULTS = {"dtype": "float32", "remat": "none", "attention": "xla",
                     "scan_layers": False}


def _compute_defaults(tree):
  """`node.get("dtype") or "float32"` / `.get("remat", "none")`: a model default given
  where a config is read; and the dataclass that declares them (`layers.Compute`)."""
  def default_of_get(call, fallback):
    if (isinstance(call, ast.Call) and getattr(call.func, "attr", None) == "get"
        and call.args and isinstance(call.args[0], ast.Constant)
        and call.args[0].value in _COMPUTE_DEFAULTS):
      key = call.args[0].value
      return isinstance(fallback, ast.Constant) and fallback.value == _COMPUTE_DEFAULTS[key]
    return False
  for node in ast.walk(tree):
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and default_of_get(
        node.values[0], node.values[-1]):
      yield ast.unparse(node)
    if isinstance(node, ast.Call) and len(node.args) == 2 and default_of_get(node,
                                                                              node.args[1]):
      yield ast.unparse(node)
    if isinstance(node, ast.ClassDef) and node.name == "Compute":
      yield "class Compute"


FACTS = {  # fact -> (finder, its one home); the chip table holds many figures, each once
    "GIB": (_gib, "avtext/aot/chips.py"),
    "FSDP_MIN_SIZE": (_fsdp_min_size, "avtext/train/partitioning.py"),
    "TVR clip length": (_tvr_clip_length, "avtext/data/builders/tvc.py"),
    "chip figures": (_chip_figure, "avtext/aot/chips.py"),
    "compute defaults": (_compute_defaults, "avtext/models/layers.py"),
}

# A second definition of each, as it was written before it got its one home.
PLANTED = {
    "GIB": "GIB = 2 ** 30\n",
    "FSDP_MIN_SIZE": "def f(config):\n  config.partitioning = dict(fsdp_min_size=2 ** 16)\n",
    "TVR clip length": "def moment_clips(ts, num_clips, clip_length: float = 1.5):\n  pass\n",
    "chip figures": 'H100 = """gpu_device_info {\n  device_memory_size: 84978434048\n}"""\n',
    "compute defaults": 'def report(config):\n  return config.model.get("remat") or "none"\n',
}


def _found(finder, sources: dict[str, str]) -> dict[str, list]:
  found = {}
  for path, text in sources.items():
    hits = list(finder(_parse(text)))
    if hits:
      found[path] = hits
  return found


@pytest.mark.parametrize("fact", sorted(FACTS))
def test_each_fact_is_defined_once_in_its_home(fact):
  finder, home = FACTS[fact]
  found = _found(finder, _sources())
  assert list(found) == [home], found
  if fact == "chip figures":
    figures = [h for h in found[home] if isinstance(h, float)]
    assert figures and len(figures) == len(set(figures)), found  # each figure once
  else:
    assert len(found[home]) == 1, found


@pytest.mark.parametrize("fact", sorted(PLANTED))
def test_a_planted_copy_of_each_fact_is_found(fact):
  finder, home = FACTS[fact]
  sources = {**_sources(), "avtext/planted.py": PLANTED[fact]}
  found = _found(finder, sources)
  assert sorted(found) == sorted([home, "avtext/planted.py"]), found


def test_the_homes_hold_the_values_their_readers_get():
  """The readers get the home's values: the builders, the configs, the XLA target and the
  partitioning defaults."""
  from avtext.data.builders import tvr  # pylint: disable=g-import-not-at-top
  from configs import mmt_tvc, xml_tvr  # pylint: disable=g-import-not-at-top
  assert tvc.CLIP_LENGTH == 1.5  # TVR s3.1: the released features' 1.5 s clips
  assert xml_tvr.get_config(None).dataset.clip_length == tvc.CLIP_LENGTH
  assert mmt_tvc.get_config(None).dataset.clip_length == tvc.CLIP_LENGTH
  assert tvr.DEFAULT_VIDEO_FEATURES == ("tvr_resnet152_rgb_max_i3d_rgb600_avg_cat_cl-1.5",)
  assert tvr.DEFAULT_SUB_FEATURES.endswith("tvr_sub_pretrained_w_sub_query_max_cl-1.5.h5")
  assert chips.GIB == 1024 ** 3
  # XLA's description of the H100 carries the table's 80 GB and 3.35 TB/s (datasheet).
  assert "device_memory_size: 80000000000" in chips.H100_TARGET
  assert "memory_bandwidth: 3350000000000" in chips.H100_TARGET
  assert partitioning.FSDP_MIN_SIZE == 65536
  compute = model_registry.compute_from_config(ml_collections.ConfigDict({}))
  assert (np.dtype(compute.dtype).name, compute.remat, compute.attention, compute.scan_layers) == (
      "float32", "none", "xla", False)
  assert compute.backend == "cpu"  # named: the platform the tests run on
  assert dataclasses.replace(compute, backend=None) == layers.Compute()


# ---- the config rules: each message raised from one place


def _raised_messages(tree):
  """The literal parts of every message a `raise` (or a `config_rules.bad(...)` call)
  builds, each once."""
  seen = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Raise) or (isinstance(node, ast.Call) and getattr(
        node.func, "attr", getattr(node.func, "id", None)) == "bad"):
      for part in ast.walk(node):
        if isinstance(part, ast.Constant) and isinstance(part.value, str) and (
            id(part) not in seen):
          seen.add(id(part))
          yield part.value


# Each rule's message (a distinctive part of it) -> the rule's path.
RULES = {
    "must be a whole number of at least 1": "counts (train.batch_size, model.**.hidden_size, ...)",
    "set train.num_steps or train.num_epochs": "train.num_steps / train.num_epochs",
    "must be more than 0; set it, or set": "train.num_epochs",
    "expected ('<evaluator>/<metric>', 'max' | 'min')": "eval.select",
    "names evaluator ": "eval.select",
    "devices of the data axis": "train.batch_size, eval.batch_size, evals.*.batch_size",
    "micro-batches that each divide": "train.microbatches",
    "must be 0 or more": "periods, warmups, decays",
    "must be in [0, 1)": "rates",
    "must divide the hidden_size": "model.**.num_heads",
    "must be a finite number above 0": "optimizer.learning_rate",
}
# How the copies were worded (trainer, partitioning, control) before the rules had a home.
_OLD_COPIES = ("must be at least 1", "devices on the 'data' mesh axis", "config.evals has",
               "set it or config.train.num_epochs", "must split into")


def _rule_sites(sources: dict[str, str], phrase: str) -> list[str]:
  return [path for path, text in sources.items()
          for message in _raised_messages(_parse(text)) if phrase in message]


@pytest.mark.parametrize("phrase", sorted(RULES) + list(_OLD_COPIES))
def test_each_config_rule_is_raised_from_one_place(phrase):
  sites = _rule_sites(_sources(), phrase)
  if phrase in _OLD_COPIES:
    assert set(sites) <= {"avtext/train/config_rules.py"}, (phrase, sites)
  else:
    assert sites == ["avtext/train/config_rules.py"], (phrase, sites)


def test_a_copied_rule_message_is_found():
  planted = ("def total_train_steps(config):\n  if config.train.get('num_steps') is None:\n"
             "    raise ValueError('config.train.num_steps: set train.num_steps or "
             "train.num_epochs')\n")
  sources = {**_sources(), "avtext/planted.py": planted}
  assert _rule_sites(sources, "set train.num_steps or train.num_epochs") == [
      "avtext/train/config_rules.py", "avtext/planted.py"]


def test_the_trainer_and_the_check_say_the_same_thing():
  """A bad step count or selection is the same one line whether `check_config` or the
  trainer meets it: one rule, one message."""
  from avtext import experiment  # pylint: disable=g-import-not-at-top
  from avtext.train import trainer  # pylint: disable=g-import-not-at-top
  from tests.test_train_trainer import tiny_config  # pylint: disable=g-import-not-at-top
  config = tiny_config(**{"train.num_steps": None, "train.num_epochs": None})
  with pytest.raises(errors.BadInput) as checked:
    experiment.check_config(config, 1)
  with pytest.raises(errors.BadInput) as trained:
    trainer.total_train_steps(config, 100)
  assert str(checked.value) == str(trained.value) == (
      "--config.train.num_steps=None: set train.num_steps or train.num_epochs")
  config = tiny_config(**{"eval.select": ("nope/R@1", "max")})
  with pytest.raises(errors.BadInput) as checked:
    experiment.check_config(config, 1)
  with pytest.raises(errors.BadInput) as built:
    config_rules.check_selected_evaluator(config, config.evals)
  assert str(checked.value) == str(built.value)
  assert "names evaluator 'nope'" in str(built.value)


@pytest.mark.parametrize("path,held", [
    ("model.hidden_size", True), ("model.text.hidden_size", True),
    ("model.video.image.hidden_size", True), ("dataset.hidden_size", False),
    ("evals.test.batch_size", True), ("evals.test.dataset.batch_size", False),
    ("train.batch_size", True), ("data.batch_size", False)])
def test_rules_hold_fields_by_path_not_by_leaf_name(path, held):
  """`model.**.hidden_size` is the model's and each tower's, never a dataset field of the
  same name; `evals.*.batch_size` one key deep."""
  config = ml_collections.ConfigDict()
  node = config
  *parents, leaf = path.split(".")
  for key in parents:
    node[key] = ml_collections.ConfigDict()
    node = node[key]
  node[leaf] = 0
  if held:
    with pytest.raises(errors.BadInput, match=f"^--config.{path}=0: must be a whole number"):
      config_rules.check_value(config, path, 0)
  else:
    config_rules.check_value(config, path, 0)
