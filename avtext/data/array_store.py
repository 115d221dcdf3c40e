"""Precomputed per-item features (COOT / TVR style) and the one collate helper.

A feature dataset holds, per item (a video, a paragraph, ...), named numpy
arrays whose leading axis may differ between items (video features [T_i, D],
sentence features [N_i, L, D], timestamps [N_i, 2]) and string fields
(captions, sentence lists). A *schema* says what every item holds:

  {"video": "float32[T, 512]", "starts": "float32[N]", "duration": "float32[]",
   "sentences": "str[N]"}

`dtype[dims]`: dtype is a numpy dtype name or 'str'; a dim is an int (fixed)
or a name (any length); 'str' alone is one string ('str[]'). Values must have
exactly that dtype and rank and the fixed dims; nothing is cast. An item
comes back as `{"id": str, key: np.ndarray | str | list[str] (nested for
str ranks > 1)}`.

Three on-disk layouts, read with random access (`Hdf5Features`,
`NpzFeatures`, `ArrayRecordFeatures`); `builders.feature_stores` opens them from
a config. Every error names the file, the item and the key, and says what was
expected. With `skip_missing=True`, items absent from the store or lacking a
schema key are dropped when the source opens, counted and logged in one
line; everything else (wrong dtype or shape, unreadable file) always raises.
"""
from __future__ import annotations

import dataclasses
import io
import os
import re
from typing import Any, Mapping, Sequence

from absl import logging
import numpy as np

from avtext.data import builders


class FeatureError(ValueError):
  """A feature store that does not hold what the schema says."""


@dataclasses.dataclass(frozen=True)
class ArraySpec:
  """dtype ('str' or a numpy dtype name) and shape (None = any length) of one key."""
  dtype: str
  shape: tuple[int | None, ...]

  @property
  def variable(self) -> bool:
    """True when the leading axis may differ between items (what `collate` pads)."""
    return bool(self.shape) and self.shape[0] is None

  def __str__(self) -> str:
    dims = ", ".join("*" if d is None else str(d) for d in self.shape)
    return f"{self.dtype}[{dims}]"


_SPEC = re.compile(r"^\s*(\w+)\s*(?:\[(.*)\])?\s*$")


def parse_spec(text: str) -> ArraySpec:
  """'float32[T, 512]' -> ArraySpec('float32', (None, 512)); 'str' -> ArraySpec('str', ())."""
  match = _SPEC.match(text)
  if not match:
    raise ValueError(f"feature spec {text!r}: expected 'dtype[dim, ...]', e.g. 'float32[T, 512]'")
  dtype, dims = match.group(1), match.group(2)
  if dtype != "str":
    try:
      dtype = np.dtype(dtype).name
    except TypeError as e:
      raise ValueError(f"feature spec {text!r}: unknown dtype {dtype!r}") from e
  shape = []
  for dim in ([] if not dims or not dims.strip() else dims.split(",")):
    dim = dim.strip()
    if not re.fullmatch(r"\d+|[A-Za-z_]\w*", dim):
      raise ValueError(f"feature spec {text!r}: dim {dim!r} is neither an int nor a name")
    shape.append(int(dim) if dim.isdigit() else None)
  return ArraySpec(dtype, tuple(shape))


def parse_schema(schema: Mapping[str, str | ArraySpec]) -> dict[str, ArraySpec]:
  """{key: spec string or ArraySpec} -> {key: ArraySpec}; 'id' is reserved for the item id."""
  if not schema:
    raise ValueError("feature schema is empty; say which keys every item holds, e.g. "
                     "{'video': 'float32[T, 512]'}")
  if "id" in schema:
    raise ValueError("feature schema: 'id' is reserved for the item id")
  return {k: v if isinstance(v, ArraySpec) else parse_spec(v) for k, v in schema.items()}


def _check(value: np.ndarray, spec: ArraySpec, where: str, key: str) -> Any:
  """`value` as returned to the user, or FeatureError when it does not match `spec`."""
  if spec.dtype == "str":
    ok_dtype = value.dtype.kind in "US"
  else:
    ok_dtype = value.dtype == np.dtype(spec.dtype)
  ok_shape = value.ndim == len(spec.shape) and all(
      want is None or want == got for want, got in zip(spec.shape, value.shape))
  if not (ok_dtype and ok_shape):
    raise FeatureError(f"{where}, key {key!r}: expected {spec}, got {value.dtype}"
                       f"{list(value.shape)}")
  if spec.dtype != "str":
    return value
  if value.dtype.kind == "S":
    value = np.char.decode(value, "utf-8")
  return value.item() if value.ndim == 0 else value.tolist()


class FeatureSource:
  """Random access to the items of one split (grain RandomAccessDataSource).

  `ids` is the item order (None for array_record, whose records name
  their items); `skipped` lists (id, reason) of the items dropped
  under skip_missing. Subclasses say where item i lives (`_stored(i)`) and,
  for skip_missing, which keys an item has (`_keys(item_id)`).
  """
  kind = builders.FEATURES
  _skip_hint = "; set dataset.skip_missing=True to skip such items"

  def __init__(self, path: str | os.PathLike, schema: Mapping[str, str | ArraySpec]):
    self.path = os.fspath(path)
    self.schema = parse_schema(schema)
    self.ids: list[str] | None = []
    self.skipped: list[tuple[str, str]] = []

  @property
  def variable_keys(self) -> tuple[str, ...]:
    """Keys whose leading axis varies between items: the ones `collate` should pad."""
    return tuple(k for k, s in self.schema.items() if s.variable and s.dtype != "str")

  def __len__(self) -> int:
    return len(self.ids)

  def __repr__(self) -> str:
    return f"{type(self).__name__}({self.path!r}, {len(self)} items)"

  def __getitem__(self, index: int) -> dict[str, Any]:
    i = int(index)
    if not 0 <= i < len(self):
      raise IndexError(f"{self!r}: index {index} out of range [0, {len(self)})")
    item_id, stored, where = self._stored(i)
    try:
      out = {"id": item_id}
      for key, spec in self.schema.items():
        if key not in stored:
          raise FeatureError(f"{where}: no key {key!r}; expected {spec} (keys there: "
                             f"{sorted(stored)}){self._skip_hint}")
        try:
          value = self._load(stored, key)
        except ValueError as e:  # e.g. a pickled object array in an .npz
          raise FeatureError(f"{where}, key {key!r}: unreadable ({e}); expected {spec}") from e
        out[key] = _check(value, spec, where, key)
      return out
    finally:
      if isinstance(stored, np.lib.npyio.NpzFile):
        stored.close()

  def _stored(self, i: int) -> tuple[str, Mapping[str, Any], str]:
    """(id, key -> stored value, 'file, item' for errors) of item i."""
    raise NotImplementedError

  def _load(self, stored: Mapping[str, Any], key: str) -> np.ndarray:
    return np.asarray(stored[key])

  def _keys(self, item_id: str) -> set[str] | None:
    """Keys stored for `item_id`, or None when the item is absent."""
    raise NotImplementedError

  def _select(self, ids: Sequence[str], *, skip_missing: bool, absent: str) -> None:
    """Sets self.ids to `ids`, dropping (and logging) incomplete items under skip_missing."""
    ids = [str(i) for i in ids]
    if not skip_missing:  # an absent item or key then fails when the item is read
      self.ids = ids
      return
    for item_id in ids:
      keys = self._keys(item_id)
      missing = [k for k in self.schema if k not in keys] if keys is not None else None
      if keys is None:
        self.skipped.append((item_id, absent))
      elif missing:
        self.skipped.append((item_id, f"no key {missing[0]!r}"))
      else:
        self.ids.append(item_id)
    if self.skipped:
      first_id, first_reason = self.skipped[0]
      logging.warning("%s: skipped %d of %d items that are absent or lack a schema key "
                      "(dataset.skip_missing=True); first: %r (%s)", self.path,
                      len(self.skipped), len(ids), first_id, first_reason)


class Hdf5Features(FeatureSource):
  """Items of one HDF5 file.

  Layout: `path` is an HDF5 file with one group per item at the root, named
  by the item id; the group holds one dataset per schema key with the
  schema's dtype and shape (strings as HDF5 string datasets, variable or
  fixed length, UTF-8 or ASCII). Extra groups and datasets are ignored.
  Items: `ids` in that order when given (e.g. a split list over a file
  shared by all splits), else every root group sorted by name.
  """

  def __init__(self, path, schema, *, ids: Sequence[str] | None = None,
               skip_missing: bool = False):
    super().__init__(path, schema)
    if not os.path.isfile(self.path):
      raise FileNotFoundError(f"{self.path}: no such HDF5 file; expected one group per item "
                              f"holding datasets {self._expected()}")
    self._file = None
    if ids is None:
      ids = sorted(k for k, v in self._h5().items() if self._is_group(v))
    self._select(ids, skip_missing=skip_missing, absent="not in the file")

  def _expected(self) -> str:
    return ", ".join(f"{k}: {s}" for k, s in self.schema.items())

  @staticmethod
  def _is_group(obj) -> bool:
    import h5py  # pylint: disable=g-import-not-at-top
    return isinstance(obj, h5py.Group)

  def _h5(self):
    if self._file is None:  # opened per process: h5py handles do not pickle
      import h5py  # pylint: disable=g-import-not-at-top
      self._file = h5py.File(self.path, "r")
    return self._file

  def __getstate__(self):
    return dict(self.__dict__, _file=None)

  def _keys(self, item_id):
    group = self._h5().get(item_id)
    return set(group.keys()) if self._is_group(group) else None

  def _stored(self, i):
    item_id = self.ids[i]
    group = self._h5().get(item_id)
    if not self._is_group(group):
      raise FeatureError(f"{self.path}: no group {item_id!r} (item {i}); expected one group "
                         f"per item holding datasets {self._expected()} (set "
                         "dataset.skip_missing=True to skip absent items)")
    return item_id, group, f"{self.path}, item {item_id!r}"

  def _load(self, stored, key):
    import h5py  # pylint: disable=g-import-not-at-top
    dataset = stored[key]
    if not isinstance(dataset, h5py.Dataset):
      return np.asarray(None)  # a group where a dataset belongs: fails the dtype check
    if h5py.check_string_dtype(dataset.dtype) is not None:
      return np.asarray(dataset.asstr()[()], dtype=str)
    return np.asarray(dataset[()])


def _npz_arrays(data: bytes | str) -> np.lib.npyio.NpzFile:
  """The arrays of one .npz archive (a path or its bytes); object arrays are refused."""
  return np.load(io.BytesIO(data) if isinstance(data, bytes) else data, allow_pickle=False)


class NpzFeatures(FeatureSource):
  """Items of one directory of .npz files.

  Layout: `path` is a directory holding `<id>.npz` per item (`np.savez`), with
  one array per schema key in the schema's dtype and shape; strings as numpy
  unicode ('<U') or UTF-8 bytes ('S') arrays, never pickled objects. Items:
  `ids` in that order when given, else every `*.npz` sorted by name.
  """

  def __init__(self, path, schema, *, ids: Sequence[str] | None = None,
               skip_missing: bool = False):
    super().__init__(path, schema)
    if not os.path.isdir(self.path):
      raise FileNotFoundError(f"{self.path}: no such directory; expected one <id>.npz per "
                              f"item holding arrays {', '.join(self.schema)}")
    if ids is None:
      ids = sorted(n[:-len(".npz")] for n in os.listdir(self.path) if n.endswith(".npz"))
    self._select(ids, skip_missing=skip_missing, absent="no .npz file")

  def _file(self, item_id: str) -> str:
    return os.path.join(self.path, f"{item_id}.npz")

  def _keys(self, item_id):
    if not os.path.isfile(self._file(item_id)):
      return None
    with _npz_arrays(self._file(item_id)) as arrays:
      return set(arrays.files)

  def _stored(self, i):
    item_id, file = self.ids[i], self._file(self.ids[i])
    if not os.path.isfile(file):
      raise FileNotFoundError(f"{file}: no such file (item {i}, id {item_id!r}); expected "
                              f"arrays {', '.join(self.schema)} (set dataset.skip_missing=True "
                              "to skip absent items)")
    return item_id, _npz_arrays(file), f"{file}, item {item_id!r}"


class ArrayRecordFeatures(FeatureSource):
  """Items of array_record file(s), record i = item i.

  Layout: `path` is one array_record file, or the shards
  `<path>-00000-of-0000N` ... read in order. Each record is the bytes of an
  .npz archive (`np.savez` into a buffer) holding 'id' (a 0-d unicode
  array) and one array per schema key, as in `NpzFeatures`. Records are dense,
  so there are no ids to select and nothing to skip: filter when writing.
  """
  _skip_hint = ""

  def __init__(self, path, schema):
    super().__init__(path, schema)
    from array_record.python import array_record_data_source  # pylint: disable=g-import-not-at-top
    self.files = self._shards()
    self._records = array_record_data_source.ArrayRecordDataSource(self.files)
    self.ids = None  # each record names its item

  def __len__(self) -> int:
    return len(self._records)

  def _shards(self) -> list[str]:
    if os.path.isfile(self.path):
      return [self.path]
    folder, base = os.path.split(self.path)
    pattern = re.compile(re.escape(base) + r"-\d{5}-of-(\d{5})$")
    names = os.listdir(folder or ".") if os.path.isdir(folder or ".") else []
    shards = sorted(n for n in names if pattern.match(n))
    if not shards:
      raise FileNotFoundError(f"{self.path}: no such array_record file (nor shards "
                              f"{base}-NNNNN-of-NNNNN); expected one .npz-encoded record per "
                              f"item holding 'id' and {', '.join(self.schema)}")
    want = int(pattern.match(shards[0]).group(1))
    if len(shards) != want:
      raise FileNotFoundError(f"{self.path}: found {len(shards)} of {want} shards "
                              f"{base}-NNNNN-of-{want:05d}")
    return [os.path.join(folder, n) for n in shards]

  def _stored(self, i):
    where = f"{self.path}, record {i}"
    try:
      arrays = _npz_arrays(self._records[i])
    except (OSError, ValueError) as e:  # not an .npz archive
      raise FeatureError(f"{where}: not an .npz archive ({e})") from e
    if "id" not in arrays.files:
      raise FeatureError(f"{where}: no key 'id'; expected a 0-d unicode array naming the item")
    item_id = _check(arrays["id"], ArraySpec("str", ()), where, "id")
    return item_id, arrays, f"{where} (id {item_id!r})"


def collate(examples: Sequence[Mapping[str, Any]], *,
            max_len: Mapping[str, int | None] | None = None,
            keys: Sequence[str] | None = None, pad_value: float = 0,
            pad_multiple: int = 1) -> dict[str, Any]:
  """One batch of `examples`: padded + masked, stacked, or listed.

  max_len: the variable-length keys and their length L: an int pads with
    `pad_value` or truncates (the first L rows kept) to exactly L, None pads
    to the longest in the batch rounded up to a multiple of `pad_multiple`
    (so a jitted consumer sees few distinct shapes). Each such key gets
    `<key>_mask` bool [B, L], True on real rows.
  keys: the keys to batch (default: those of the first example).
  Other numeric values (numpy arrays, bools, ints, floats) are stacked and
  must agree in shape; anything else (ids, strings, lists, None) stays a
  Python list of length B.
  """
  if not examples:
    raise ValueError("collate: no examples")
  max_len = dict(max_len or {})
  keys = list(examples[0] if keys is None else keys)
  out: dict[str, Any] = {}
  for key in keys:
    absent = [i for i, ex in enumerate(examples) if key not in ex]
    if absent:
      raise KeyError(f"collate: example {absent[0]} has no key {key!r}")
    values = [ex[key] for ex in examples]
    if key in max_len:
      if f"{key}_mask" in keys:
        raise ValueError(f"collate: key {key}_mask exists; it would clash with {key!r}'s mask")
      out[key], out[f"{key}_mask"] = _pad(values, max_len[key], pad_value, key, pad_multiple)
    elif all(isinstance(v, (np.ndarray, np.generic, bool, int, float)) and
             np.asarray(v).dtype.kind in "biuf" for v in values):
      shapes = {np.shape(v) for v in values}
      if len(shapes) > 1:
        raise ValueError(f"collate: key {key!r} has shapes {sorted(shapes)}; pad it by naming "
                         "it in max_len")
      out[key] = np.stack([np.asarray(v) for v in values])
    else:
      out[key] = list(values)
  unknown = set(max_len) - set(keys)
  if unknown:
    raise KeyError(f"collate: max_len names keys {sorted(unknown)} that are not batched")
  return out


def _pad(values: list, length: int | None, pad_value: float, key: str, multiple: int = 1
         ) -> tuple[np.ndarray, np.ndarray]:
  arrays = [np.asarray(v) for v in values]
  if any(a.ndim == 0 for a in arrays):
    raise ValueError(f"collate: key {key!r} is a scalar; only leading axes can be padded")
  if any(a.dtype.kind not in "biuf" for a in arrays):
    raise ValueError(f"collate: key {key!r} is not numeric ({arrays[0].dtype}); only numeric "
                     "arrays are padded, other values are batched as lists")
  trailing = {a.shape[1:] for a in arrays}
  if len(trailing) > 1:
    raise ValueError(f"collate: key {key!r} has trailing shapes {sorted(trailing)}; only the "
                     "leading axis may differ")
  if length is None:
    length = max(1, -(-max(len(a) for a in arrays) // multiple)) * multiple
  dtype = np.result_type(*arrays)
  out = np.full((len(arrays), length) + arrays[0].shape[1:], pad_value, dtype)
  mask = np.zeros((len(arrays), length), bool)
  for i, a in enumerate(arrays):
    n = min(len(a), length)
    out[i, :n] = a[:n]
    mask[i, :n] = True
  return out, mask


def pack(values: np.ndarray, mask: np.ndarray, *, rows: int | None = None,
         row_multiple: int = 1) -> dict[str, np.ndarray]:
  """Sequence packing: the N sequences of a padded batch, several to a row.

  values [N, L, ...] with mask [N, L] (True on each sequence's real prefix, as `collate`
  builds them) -> the sequences first-fit-decreasing into rows of the same L (no
  sequence is split), so per-position work follows the real lengths, not N * L:
    packed [R, L, ...] (zeros on padding), packed_mask [R, L];
    segment [R, L] int32: which sequence of its row a position belongs to (-1: padding),
      for attention within a sequence only;
    position [R, L] int32: the position within its own sequence (0 on padding);
    unpack [N, L] int32: for each sequence, the flat index r * L + t of its positions
      (-1 beyond its length): `packed.reshape(R * L, ...)[unpack]` is `values` on the
      real positions.
  R is `rows` when given (an error when the sequences need more), else the rows used
  rounded up to a multiple of `row_multiple` (at least 1) and at most N, so a packed
  batch is never larger than the padded one (`CootTask.batch_spec`).
  """
  values, mask = np.asarray(values), np.asarray(mask, bool)
  n, length = mask.shape
  lengths = mask.sum(1)
  if not np.array_equal(mask, np.arange(length)[None, :] < lengths[:, None]):
    raise ValueError("pack: each mask row must be a real prefix (True, then False)")
  free = []  # per row: the positions left
  row_of = np.zeros(n, np.int64)
  start = np.zeros(n, np.int64)
  for i in np.argsort(-lengths, kind="stable"):
    if lengths[i] == 0:
      row_of[i] = -1
      continue
    r = next((r for r, f in enumerate(free) if f >= lengths[i]), len(free))
    if r == len(free):
      free.append(length)
    row_of[i], start[i] = r, length - free[r]
    free[r] -= lengths[i]
  used = max(len(free), 1)
  if rows is None:  # rounded up, but never more rows than the padded layout has
    rows = min(-(-used // row_multiple) * row_multiple, max(n, used))
  elif used > rows:
    raise ValueError(f"pack: the sequences need {used} rows, more than rows={rows}")
  packed = np.zeros((rows, length) + values.shape[2:], values.dtype)
  packed_mask = np.zeros((rows, length), bool)
  segment = np.full((rows, length), -1, np.int32)
  position = np.zeros((rows, length), np.int32)
  unpack = np.full((n, length), -1, np.int32)
  count = np.zeros(rows, np.int32)  # sequences placed in each row so far
  for i in np.flatnonzero(row_of >= 0):
    r, s, k = row_of[i], start[i], lengths[i]
    packed[r, s:s + k] = values[i, :k]
    packed_mask[r, s:s + k] = True
    segment[r, s:s + k] = count[r]
    count[r] += 1
    position[r, s:s + k] = np.arange(k)
    unpack[i, :k] = r * length + s + np.arange(k)
  return {"packed": packed, "packed_mask": packed_mask, "segment": segment,
          "position": position, "unpack": unpack}
