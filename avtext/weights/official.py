"""Official PyTorch checkpoints -> avtext run directories: the shared part.

`python -m avtext.import_checkpoint --system=S --checkpoint=FILE --out=RUNDIR` reads
the checkpoint (`read_checkpoint`, here), lets the system's converter
(`avtext/weights/official_<S>.py`) map the official hyper-parameters onto the config and
the official tensors onto the model's parameters through a `Porter` (here), and writes a
run directory that `--mode=eval`, `avtext.runs.load_run`, the notebook and
`config.init_from` open like a trained run (the tool: it builds the trainer's state).

Formats read (`read_checkpoint`):
- PyTorch files (`torch.save`: .pt / .pth / .ckpt / .chkpt / .bin): torch is needed
  (`pip install -e .[convert]`, never in the default install). The pickle is read with an
  unpickler that builds only torch's tensors and plain containers; any other class the
  official code pickled beside the weights (EasyDict configs, argparse Namespaces) is read
  back as a plain dict of its attributes, so no official code is imported or executed.
- NumPy .npz: a flat {official tensor name: array} state dict, no torch needed. A
  `__meta__` entry, if present, is a JSON string of the checkpoint's non-tensor entries
  (what the official code pickled beside the weights, e.g. its `model_cfg`).

A converter module provides
    DEFAULT_CONFIG: str                      # configs/<x>.py[:variant]
    configure(config, checkpoint) -> config  # the official hyper-parameters onto config.model
    convert(checkpoint, porter, config)      # porter.take(...) / porter.set(...) per tensor
and `Porter.finish` checks that every official tensor was used exactly once and every
avtext leaf set exactly once, naming the ones that were not.
"""
import dataclasses
import io
import json
import pathlib
import pickle
import zipfile
from typing import Any, Iterable

import jax
import numpy as np

TORCH_SUFFIXES = (".pt", ".pth", ".ckpt", ".chkpt", ".bin", ".pkl")
META_KEY = "__meta__"
IMPORT_FILE = "import.json"


class ImportCheckpointError(ValueError):
  """The checkpoint does not fit the model (the message names the tensors)."""


@dataclasses.dataclass
class Checkpoint:
  """A read official checkpoint: the flat state dict and what was pickled beside it."""
  tensors: dict[str, np.ndarray]  # official name -> float array, as the official code names it
  meta: dict[str, Any]  # non-tensor entries (model_cfg, opt, epoch, ...), plain containers
  path: pathlib.Path


# ---------------------------------------------------------------- reading


class _Opaque(dict):
  """Stand-in for a class pickled beside the weights (EasyDict, argparse.Namespace, ...):
  its constructor arguments, dict items and attributes end up as dict items."""

  def __init__(self, *args, **kwargs):  # pylint: disable=unused-argument
    super().__init__()

  def __setstate__(self, state):
    if isinstance(state, tuple) and len(state) == 2:  # (dict state, slot state)
      state = {**(state[0] or {}), **(state[1] or {})}
    if isinstance(state, dict):
      self.update(state)

  def __setattr__(self, name, value):
    self[name] = value


def _opaque_class(module: str, name: str) -> type:
  return type(name, (_Opaque,), {"__module__": f"official.{module}"})


_ALLOWED_MODULES = ("torch", "collections", "numpy", "builtins", "copyreg", "_codecs")


def _torch_pickle_module():
  """A pickle module whose Unpickler resolves only torch / numpy / container classes."""

  class Unpickler(pickle.Unpickler):

    def find_class(self, module, name):
      if module.split(".")[0] in _ALLOWED_MODULES:
        return super().find_class(module, name)
      return _opaque_class(module, name)

  mod = type(pickle)("avtext_official_pickle")
  mod.__dict__.update({k: getattr(pickle, k) for k in dir(pickle) if not k.startswith("__")})
  mod.Unpickler = Unpickler
  mod.load = lambda f, **kw: Unpickler(f, **kw).load()
  mod.loads = lambda b, **kw: Unpickler(io.BytesIO(b), **kw).load()
  return mod


def _plain(obj: Any, torch) -> Any:
  """Tensors -> numpy; dict subclasses and other containers -> plain containers."""
  if torch is not None and isinstance(obj, torch.Tensor):
    return obj.detach().cpu().float().numpy() if obj.is_floating_point() else obj.numpy()
  if isinstance(obj, dict):
    return {k: _plain(v, torch) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return type(obj)(_plain(v, torch) for v in obj) if type(obj) in (list, tuple) else \
        [_plain(v, torch) for v in obj]
  return obj


def _is_state_dict(obj: Any) -> bool:
  return isinstance(obj, dict) and bool(obj) and all(
      isinstance(k, str) and isinstance(v, np.ndarray) for k, v in obj.items())


def split_state_dict(obj: Any, path: pathlib.Path,
                     keys: Iterable[str] = ("model", "state_dict", "model_state_dict")
                     ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
  """(flat state dict, the other entries) of a loaded checkpoint object: the object itself
  when it is a state dict, else its first entry under `keys` that is one, else (a dict or
  list of state dicts, one per network) all of them as "<network key or index>.<tensor>"."""
  if _is_state_dict(obj):
    return dict(obj), {}
  if isinstance(obj, dict):
    for key in keys:
      if _is_state_dict(obj.get(key)):
        return dict(obj[key]), {k: v for k, v in obj.items() if k != key}
  nested = (list(obj.items()) if isinstance(obj, dict) else
            [(str(i), v) for i, v in enumerate(obj)] if isinstance(obj, list) else [])
  if nested and all(isinstance(k, str) and _is_state_dict(v) for k, v in nested):
    # One state dict per network (COOT's nntrainer: {"net_video_local": {...}, ...}; the
    # first coot-videotext release: a list of them): flattened as "<network>.<tensor>".
    return {f"{k}.{name}": t for k, v in nested for name, t in v.items()}, {}
  found = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
  raise ImportCheckpointError(
      f"{path}: no state dict found (top level: {found}); expected a state dict or a dict "
      f"with one under {list(keys)}")


def read_checkpoint(path: str | pathlib.Path) -> Checkpoint:
  """Reads an official checkpoint (module docstring: formats)."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"--checkpoint={path}: no such file")
  if path.suffix == ".npz":
    try:
      with np.load(path, allow_pickle=False) as data:
        tensors = {k: data[k] for k in data.files if k != META_KEY}
        meta = json.loads(str(data[META_KEY])) if META_KEY in data.files else {}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile):
      # numpy's own words for a file that is no .npz (empty, cut short, a pickle) advise
      # allow_pickle, which would run the file's code: never that.
      what = ("the file is empty" if path.stat().st_size == 0 else
              "its bytes are no zip archive of .npy arrays")
      raise ImportCheckpointError(
          f"{path}: not an .npz of arrays ({what}); expected the state dict saved with "
          "numpy.savez (avtext.weights.official.save_npz), or the PyTorch checkpoint "
          "itself") from None
    if not tensors:
      raise ImportCheckpointError(f"{path}: holds no arrays")
    return Checkpoint(tensors=tensors, meta=meta, path=path)
  if path.suffix not in TORCH_SUFFIXES:
    raise ImportCheckpointError(f"{path}: unknown checkpoint format {path.suffix!r}; expected "
                                f"a PyTorch file ({', '.join(TORCH_SUFFIXES)}) or .npz")
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(f"{path}: reading a PyTorch checkpoint needs torch, which the default "
                      "install leaves out: pip install -e .[convert] (or save the state "
                      "dict as .npz)") from e
  obj = torch.load(path, map_location="cpu", weights_only=False,
                   pickle_module=_torch_pickle_module())
  tensors, meta = split_state_dict(_plain(obj, torch), path)
  return Checkpoint(tensors=tensors, meta=meta, path=path)


def save_npz(path: str | pathlib.Path, tensors: dict[str, np.ndarray],
             meta: dict[str, Any] | None = None) -> None:
  """Writes the .npz format `read_checkpoint` reads (tests; torch-free conversions)."""
  arrays = dict(tensors)
  if meta:
    arrays[META_KEY] = np.asarray(json.dumps(meta))
  np.savez(path, **arrays)


# ---------------------------------------------------------------- mapping


def _key(path) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def flatten(tree: Any) -> dict[str, Any]:
  """{"a/b/c": leaf} of a nested tree: the leaf names `Porter.set` takes."""
  return {_key(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


class Porter:
  """Bookkeeping of one import: each official tensor taken once, each avtext leaf set once.

  `take(name)` returns an official tensor (marking it used); `set(path, value)` assigns
  the avtext leaf at "a/b/c" of `abstract` ({"params": ..., other collections}); `finish()`
  returns the variables as nested numpy dicts, or raises naming every unused tensor,
  missing tensor, unset leaf and shape mismatch at once.
  """

  def __init__(self, checkpoint: Checkpoint, abstract: Any):
    self.checkpoint = checkpoint
    self._leaves = flatten(abstract)
    self._treedef = jax.tree_util.tree_structure(abstract)
    self._order = list(self._leaves)
    self._values: dict[str, np.ndarray] = {}
    self._used: set[str] = set()
    self.errors: list[str] = []

  @property
  def names(self) -> list[str]:
    return list(self.checkpoint.tensors)

  def has(self, name: str) -> bool:
    return name in self.checkpoint.tensors

  def take(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """The official tensor `name` (zeros of `shape` and an error when absent or reused)."""
    tensor = self.checkpoint.tensors.get(name)
    if tensor is None:
      self.errors.append(f"official tensor {name!r} missing")
      return np.zeros(shape or (0,), np.float32)
    if name in self._used:
      self.errors.append(f"official tensor {name!r} used twice")
    self._used.add(name)
    if shape is not None and tuple(tensor.shape) != tuple(shape):
      self.errors.append(f"official tensor {name!r}: shape {tuple(tensor.shape)}, "
                         f"expected {tuple(shape)}")
    return np.asarray(tensor)

  def skip(self, name: str) -> None:
    """Marks an official tensor deliberately unused (a buffer the model recomputes)."""
    if name not in self.checkpoint.tensors:
      self.errors.append(f"official tensor {name!r} missing")
    self._used.add(name)

  def shape(self, path: str) -> tuple[int, ...]:
    if path not in self._leaves:
      raise KeyError(f"avtext leaf {path!r} does not exist; leaves under its parent: "
                     f"{[k for k in self._order if k.startswith(path.rsplit('/', 1)[0])][:12]}")
    return tuple(self._leaves[path].shape)

  def set(self, path: str, value: Any, *, source: str = "") -> None:
    """Assigns avtext leaf `path` ("params/a/b/kernel"); the value is reshaped only when
    it has the leaf's size and the shapes differ by unit axes (layouts are the
    converter's job)."""
    if path not in self._leaves:
      self.errors.append(f"avtext leaf {path!r} does not exist (from {source or 'converter'})")
      return
    if path in self._values:
      self.errors.append(f"avtext leaf {path!r} set twice (again from {source or 'converter'})")
    want = tuple(self._leaves[path].shape)
    value = np.asarray(value, dtype=self._leaves[path].dtype)
    if value.shape != want:
      if value.size == int(np.prod(want)) and (
          tuple(d for d in value.shape if d != 1) == tuple(d for d in want if d != 1)):
        value = value.reshape(want)
      else:
        self.errors.append(f"avtext leaf {path!r}: shape {want}, got {value.shape} from "
                           f"{source or 'converter'}")
        return
    self._values[path] = value

  def copy(self, name: str, path: str, transform=None) -> None:
    """set(path, transform(take(name)))."""
    value = self.take(name)
    self.set(path, transform(value) if transform else value, source=name)

  def finish(self) -> Any:
    unused = [n for n in self.checkpoint.tensors if n not in self._used]
    unset = [k for k in self._order if k not in self._values]
    problems = list(self.errors)
    if unused:
      problems.append(f"{len(unused)} official tensor(s) not used: {unused}")
    if unset:
      problems.append(f"{len(unset)} avtext leaf/leaves not set: {unset}")
    if problems:
      raise ImportCheckpointError(f"{self.checkpoint.path}: does not fit the model:\n  - "
                                  + "\n  - ".join(problems))
    return jax.tree_util.tree_unflatten(self._treedef, [self._values[k] for k in self._order])


# ---------------------------------------------------------------- linear layouts


def linear_kernel(w: np.ndarray) -> np.ndarray:
  """torch Linear weight [out, in] -> flax Dense kernel [in, out]."""
  return np.asarray(w).T


def heads_in(w: np.ndarray, num_heads: int) -> np.ndarray:
  """torch Linear weight [H*Dh, in] -> DenseGeneral kernel [in, H, Dh] (query/key/value)."""
  out, n_in = w.shape
  return np.asarray(w).T.reshape(n_in, num_heads, out // num_heads)


def heads_bias(b: np.ndarray, num_heads: int) -> np.ndarray:
  return np.asarray(b).reshape(num_heads, -1)


def heads_out(w: np.ndarray, num_heads: int) -> np.ndarray:
  """torch Linear weight [out, H*Dh] -> DenseGeneral kernel [H, Dh, out] (output proj.)."""
  out, n_in = w.shape
  return np.asarray(w).T.reshape(num_heads, n_in // num_heads, out)
