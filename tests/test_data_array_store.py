"""Precomputed feature stores (HDF5, .npz, array_record) and `array_store.collate`."""
import io
import logging
import os
import pickle

from array_record.python import array_record_module
import h5py
import ml_collections
import numpy as np
import pytest

from avtext.data import builders
from avtext.data import array_store

SCHEMA = {"video": "float32[T, 2]", "n": "int64[]", "sentences": "str[N]", "title": "str"}

# Hand-made items with different lengths (ids deliberately not in sorted order).
ITEMS = {
    "vid_b": {"video": np.array([[1.5, -2.0], [3.0, 4.25], [0.0, 7.0]], np.float32),
              "n": np.int64(2), "sentences": np.array(["a dog runs", "it stops"]),
              "title": np.array("Dog")},
    "vid_a": {"video": np.array([[9.0, 8.0]], np.float32), "n": np.int64(1),
              "sentences": np.array(["zoë sings"]), "title": np.array("Song")},
}


def _npz_bytes(arrays):
  buf = io.BytesIO()
  np.savez(buf, **arrays)
  return buf.getvalue()


def write(layout, folder, items, name="train"):
  """`items` {id: {key: array}} in `layout`, as the docstrings describe it; its path."""
  if layout == "hdf5":
    path = os.path.join(folder, f"{name}.h5")
    with h5py.File(path, "w") as f:
      for item_id, arrays in items.items():
        group = f.create_group(item_id)
        for key, value in arrays.items():
          if np.asarray(value).dtype.kind == "U":
            value = np.asarray(value, dtype=h5py.string_dtype()) if np.ndim(value) else str(value)
            group.create_dataset(key, data=value, dtype=h5py.string_dtype())
          else:
            group.create_dataset(key, data=value)
  elif layout == "npz":
    path = os.path.join(folder, name)
    os.makedirs(path)
    for item_id, arrays in items.items():
      np.savez(os.path.join(path, f"{item_id}.npz"), **arrays)
  else:
    path = os.path.join(folder, f"{name}.array_record")
    writer = array_record_module.ArrayRecordWriter(path, "group_size:1")
    for item_id, arrays in items.items():
      writer.write(_npz_bytes(dict(arrays, id=np.array(item_id))))
    writer.close()
  return path


def open_source(layout, path, schema=SCHEMA, **kwargs):
  cls = {"hdf5": array_store.Hdf5Features, "npz": array_store.NpzFeatures,
         "array_record": array_store.ArrayRecordFeatures}[layout]
  return cls(path, schema, **kwargs)


LAYOUTS = ("hdf5", "npz", "array_record")


def test_parse_spec():
  assert array_store.parse_spec("float32[T, 512]") == array_store.ArraySpec("float32", (None, 512))
  assert array_store.parse_spec("str") == array_store.ArraySpec("str", ())
  assert array_store.parse_spec("int64[]") == array_store.ArraySpec("int64", ())
  assert array_store.parse_spec("uint8[N,L, 3]").shape == (None, None, 3)
  assert str(array_store.parse_spec("float32[T, 512]")) == "float32[*, 512]"
  with pytest.raises(ValueError, match="unknown dtype 'floot32'"):
    array_store.parse_spec("floot32[T]")
  with pytest.raises(ValueError, match="dim '-1'"):
    array_store.parse_spec("float32[-1]")
  with pytest.raises(ValueError, match="'id' is reserved"):
    array_store.parse_schema({"id": "str"})


@pytest.mark.parametrize("layout", LAYOUTS)
def test_round_trip_exact_values(tmp_path, layout):
  source = open_source(layout, write(layout, str(tmp_path), ITEMS))
  assert source.kind == builders.FEATURES and len(source) == 2
  assert source.variable_keys == ("video",)
  # hdf5 / npz: ids sorted; array_record: record order.
  order = ["vid_b", "vid_a"] if layout == "array_record" else ["vid_a", "vid_b"]
  for i, item_id in enumerate(order):
    got = source[i]
    want = ITEMS[item_id]
    assert set(got) == {"id", "video", "n", "sentences", "title"}
    assert got["id"] == item_id
    assert got["video"].dtype == np.float32 and got["video"].tobytes() == want["video"].tobytes()
    assert got["video"].shape == want["video"].shape
    assert got["n"].dtype == np.int64 and got["n"] == want["n"]
    assert got["sentences"] == want["sentences"].tolist()
    assert isinstance(got["title"], str) and got["title"] == str(want["title"])
  again = pickle.loads(pickle.dumps(source))  # grain worker processes get a copy
  np.testing.assert_array_equal(again[1]["video"], ITEMS[order[1]]["video"])
  with pytest.raises(IndexError):
    source[2]


def test_array_record_shards_are_read_in_order(tmp_path):
  base = tmp_path / "train.array_record"
  for shard, item_id in enumerate(["vid_b", "vid_a"]):
    writer = array_record_module.ArrayRecordWriter(f"{base}-{shard:05d}-of-00002",
                                                   "group_size:1")
    writer.write(_npz_bytes(dict(ITEMS[item_id], id=np.array(item_id))))
    writer.close()
  source = array_store.ArrayRecordFeatures(str(base), SCHEMA)
  assert [source[i]["id"] for i in range(len(source))] == ["vid_b", "vid_a"]
  np.testing.assert_array_equal(source[1]["video"], [[9.0, 8.0]])
  os.remove(f"{base}-00001-of-00002")
  with pytest.raises(FileNotFoundError, match=r"found 1 of 2 shards"):
    array_store.ArrayRecordFeatures(str(base), SCHEMA)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_missing_file(tmp_path, layout):
  path = str(tmp_path / {"hdf5": "val.h5", "npz": "val", "array_record": "val.array_record"}[
      layout])
  with pytest.raises(FileNotFoundError) as e:
    open_source(layout, path)
  assert str(e.value).startswith(f"{path}: no such")
  assert "video" in str(e.value)  # what the file should hold


@pytest.mark.parametrize("layout", LAYOUTS)
def test_missing_key_names_file_item_and_key(tmp_path, layout):
  items = {"v1": {k: v for k, v in ITEMS["vid_a"].items() if k != "sentences"}}
  path = write(layout, str(tmp_path), items)
  with pytest.raises(array_store.FeatureError) as e:
    open_source(layout, path)[0]
  message = str(e.value)
  assert path in message and "'v1'" in message
  assert "no key 'sentences'; expected str[*]" in message


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("bad, got", [
    (np.zeros((4, 3), np.float32), "float32[4, 3]"),   # wrong trailing dim
    (np.zeros((4,), np.float32), "float32[4]"),        # wrong rank
    (np.zeros((4, 2), np.float64), "float64[4, 2]"),   # wrong dtype
])
def test_wrong_shape_or_dtype_names_file_item_and_key(tmp_path, layout, bad, got):
  path = write(layout, str(tmp_path), {"v1": dict(ITEMS["vid_a"], video=bad)})
  with pytest.raises(array_store.FeatureError) as e:
    open_source(layout, path)[0]
  message = str(e.value)
  assert path in message and "'v1'" in message
  assert message.endswith(f"key 'video': expected float32[*, 2], got {got}")


def test_array_record_without_id(tmp_path):
  path = str(tmp_path / "train.array_record")
  writer = array_record_module.ArrayRecordWriter(path, "group_size:1")
  writer.write(_npz_bytes(ITEMS["vid_a"]))
  writer.close()
  with pytest.raises(array_store.FeatureError, match=r"record 0: no key 'id'"):
    array_store.ArrayRecordFeatures(path, SCHEMA)[0]


def test_pickled_object_arrays_are_refused(tmp_path):
  os.makedirs(tmp_path / "train")
  np.savez(tmp_path / "train" / "v1.npz", **dict(
      ITEMS["vid_a"], sentences=np.array(["x", None], dtype=object)))
  with pytest.raises(array_store.FeatureError,
                     match=r"v1.npz, item 'v1', key 'sentences': unreadable"):
    array_store.NpzFeatures(str(tmp_path / "train"), SCHEMA)[0]


@pytest.mark.parametrize("layout", ("hdf5", "npz"))
def test_id_list_and_skip_missing(tmp_path, layout, caplog):
  items = {"a": ITEMS["vid_a"], "b": ITEMS["vid_b"],
           "c": {k: v for k, v in ITEMS["vid_a"].items() if k != "video"}}
  path = write(layout, str(tmp_path), items)
  ids = ["b", "ghost", "c", "a"]
  # Without skip_missing every listed item is kept, and reading an incomplete one fails.
  strict = open_source(layout, path, ids=ids)
  assert len(strict) == 4 and strict[0]["id"] == "b"
  with pytest.raises((FileNotFoundError, array_store.FeatureError), match="ghost"):
    strict[1]
  with pytest.raises(array_store.FeatureError, match="no key 'video'"):
    strict[2]
  with caplog.at_level(logging.WARNING):
    lenient = open_source(layout, path, ids=ids, skip_missing=True)
  assert lenient.ids == ["b", "a"] and [lenient[i]["id"] for i in range(2)] == ["b", "a"]
  absent = "not in the file" if layout == "hdf5" else "no .npz file"
  assert lenient.skipped == [("ghost", absent), ("c", "no key 'video'")]
  lines = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
  assert len(lines) == 1
  assert lines[0].startswith(f"{path}: skipped 2 of 4 items")
  assert "skip_missing=True" in lines[0] and "'ghost'" in lines[0]


def _renamed(config, name):
  return ml_collections.ConfigDict(dict(config.to_dict(), name=name))


def test_registry_opens_each_layout_from_config(tmp_path):
  root = str(tmp_path)
  write("hdf5", root, ITEMS, name="all")
  write("npz", root, ITEMS, name="val")
  write("array_record", root, ITEMS, name="train")
  (tmp_path / "val_ids.txt").write_text("vid_b\nmissing\n")
  config = ml_collections.ConfigDict(dict(
      name="features:hdf5", path=root, features=SCHEMA, files={"train": "all.h5"},
      ids={"val": "val_ids.txt"}, skip_missing=True))
  h5 = builders.get_source(config, "train")
  assert isinstance(h5, array_store.Hdf5Features) and h5.ids == ["vid_a", "vid_b"]
  with pytest.raises(FileNotFoundError, match=r"val.h5: no such HDF5 file"):
    builders.get_source(config, "validation")  # default file name <split>.h5
  npz = builders.get_source(_renamed(config, "features:npz"), "validation")  # <path>/val/
  assert npz.ids == ["vid_b"] and npz.skipped == [("missing", "no .npz file")]
  with pytest.raises(ValueError, match="dataset.ids and dataset.skip_missing do not apply"):
    builders.get_source(_renamed(config, "features:array_record"), "train")
  plain = ml_collections.ConfigDict(dict(name="features:array_record", path=root,
                                         features=SCHEMA))
  records = builders.get_source(plain, "train")  # <path>/train.array_record
  assert [records[i]["id"] for i in range(2)] == ["vid_b", "vid_a"]
  with pytest.raises(ValueError, match=r"'features:npz' needs config.dataset.features"):
    builders.get_source(ml_collections.ConfigDict(dict(name="features:npz", path=root)), "val")
  with pytest.raises(FileNotFoundError, match=r"nope.txt: no such id list"):
    config.ids = {"val": "nope.txt"}
    builders.get_source(_renamed(config, "features:npz"), "val")


def test_collate_pads_masks_stacks_and_lists():
  examples = [
      {"id": "x", "video": np.array([[1, 2], [3, 4], [5, 6]], np.float32), "n": np.int64(3),
       "pos": np.array([0.5, 1.5], np.float32), "sentences": ["s1", "s2"], "flag": True},
      {"id": "y", "video": np.array([[7, 8]], np.float32), "n": np.int64(1),
       "pos": np.array([2.5, 3.5], np.float32), "sentences": ["s3"], "flag": False},
  ]
  batch = array_store.collate(examples, max_len={"video": None})
  assert set(batch) == {"id", "video", "video_mask", "n", "pos", "sentences", "flag"}
  np.testing.assert_array_equal(batch["video"], np.array(
      [[[1, 2], [3, 4], [5, 6]], [[7, 8], [0, 0], [0, 0]]], np.float32))
  assert batch["video"].dtype == np.float32
  np.testing.assert_array_equal(batch["video_mask"], [[True, True, True], [True, False, False]])
  assert batch["video_mask"].dtype == bool
  np.testing.assert_array_equal(batch["n"], np.array([3, 1], np.int64))
  np.testing.assert_array_equal(batch["pos"], np.array([[0.5, 1.5], [2.5, 3.5]], np.float32))
  np.testing.assert_array_equal(batch["flag"], [True, False])
  assert batch["id"] == ["x", "y"] and batch["sentences"] == [["s1", "s2"], ["s3"]]

  # A configured length truncates (first rows kept) and pads, with pad_value.
  short = array_store.collate(examples, max_len={"video": 2}, keys=("video", "id"), pad_value=-1)
  assert set(short) == {"video", "video_mask", "id"}
  np.testing.assert_array_equal(short["video"], np.array(
      [[[1, 2], [3, 4]], [[7, 8], [-1, -1]]], np.float32))
  np.testing.assert_array_equal(short["video_mask"], [[True, True], [True, False]])
  long = array_store.collate(examples, max_len={"video": 4}, keys=("video",))
  np.testing.assert_array_equal(long["video"][0], [[1, 2], [3, 4], [5, 6], [0, 0]])
  np.testing.assert_array_equal(long["video_mask"], [[1, 1, 1, 0], [1, 0, 0, 0]])


def test_collate_errors():
  a = {"video": np.zeros((2, 3)), "n": np.zeros(2)}
  b = {"video": np.zeros((1, 3)), "n": np.zeros(3)}
  with pytest.raises(ValueError, match=r"key 'n' has shapes \[\(2,\), \(3,\)\]"):
    array_store.collate([a, b], max_len={"video": None})
  with pytest.raises(ValueError, match="key 'video' has trailing shapes"):
    array_store.collate([a, {"video": np.zeros((1, 4))}], max_len={"video": None}, keys=["video"])
  with pytest.raises(KeyError, match="example 1 has no key 'n'"):
    array_store.collate([a, {"video": np.zeros((1, 3))}], max_len={"video": None})
  with pytest.raises(KeyError, match=r"max_len names keys \['audio'\]"):
    array_store.collate([a], max_len={"audio": 4})
  with pytest.raises(ValueError, match="would clash"):
    array_store.collate([dict(a, video_mask=np.ones(2))], max_len={"video": None})
  with pytest.raises(ValueError, match="'n' is a scalar"):
    array_store.collate([{"n": np.int64(1)}], max_len={"n": None})
  with pytest.raises(ValueError, match="'s' is not numeric"):
    array_store.collate([{"s": ["a", "b"]}], max_len={"s": None})


def test_collate_pads_to_a_multiple_of_the_longest():
  out = array_store.collate([{"x": np.ones((3, 2))}, {"x": np.ones((9, 2))}],
                         max_len={"x": None}, pad_multiple=8)
  assert out["x"].shape == (2, 16, 2)
  np.testing.assert_array_equal(out["x_mask"].sum(1), [3, 9])
  # A fixed length ignores the multiple; empty arrays still get one (masked) row.
  assert array_store.collate([{"x": np.ones((3, 2))}], max_len={"x": 5},
                          pad_multiple=8)["x"].shape == (1, 5, 2)
  empty = array_store.collate([{"x": np.ones((0, 2))}], max_len={"x": None}, pad_multiple=4)
  assert empty["x"].shape == (1, 4, 2) and not empty["x_mask"].any()
