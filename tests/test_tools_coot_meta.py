"""`python -m avtext.tools.coot_meta`: COOT's meta file from the official annotations.

Small ActivityNet Captions and YouCook2 files in their official formats (COOT's
annotations/activitynet/{train,val_1,val_2}.json and
annotations/youcook2/youcookii_annotations_trainval.json) with a past-the-end, a
zero-length and a reversed segment; the meta and the `coot` dataset's frames are
worked out by hand below.
"""
import json

import ml_collections
import numpy as np
import pytest

from avtext.data import builders
from avtext.data import coot_files
from tests.test_cli_failsoft import _one_error_line
from tests.test_cli_failsoft import _run

TOOL = "avtext.tools.coot_meta"

ANET = {
    "train": {
        "v_vidA": {"duration": 20.0, "timestamps": [[0, 4.5], [3.2, 25.0], [8, 8], [15.5, 11]],
                   "sentences": ["A man  walks\nin.", " He sits down.", "He waves.",
                                 "He leaves."]},
        "v_vidB": {"duration": 10.0, "timestamps": [[1, 9]], "sentences": ["A dog runs."]},
    },
    "val_1": {"v_vidA": {"duration": 20.0, "timestamps": [[2, 6]],
                         "sentences": ["A man walks in."]}},
    "val_2": {"v_vidC": {"duration": 30.0, "timestamps": [[0, 31]],
                         "sentences": ["Someone cooks."]}},
}
# COOT's meta: key <id>_<split>, spaces collapsed (the leading one kept), reversed swapped,
# the stop past the end at the end (25 -> 20, 31 -> 30), the zero-length segment kept.
ANET_META = {
    "vidA_train": {"data_key": "vidA", "split": "train", "duration_sec": 20.0, "segments": [
        {"text": "A man walks in.", "start_sec": 0, "stop_sec": 4.5},
        {"text": " He sits down.", "start_sec": 3.2, "stop_sec": 20.0},
        {"text": "He waves.", "start_sec": 8, "stop_sec": 8},
        {"text": "He leaves.", "start_sec": 11, "stop_sec": 15.5}]},
    "vidB_train": {"data_key": "vidB", "split": "train", "duration_sec": 10.0, "segments": [
        {"text": "A dog runs.", "start_sec": 1, "stop_sec": 9}]},
    "vidA_val_1": {"data_key": "vidA", "split": "val_1", "duration_sec": 20.0, "segments": [
        {"text": "A man walks in.", "start_sec": 2, "stop_sec": 6}]},
    "vidC_val_2": {"data_key": "vidC", "split": "val_2", "duration_sec": 30.0, "segments": [
        {"text": "Someone cooks.", "start_sec": 0, "stop_sec": 30.0}]},
}
# vidA: 40 frames over 20 s (fps 2), add_stop_frame 1: start floor(2 s), stop min(ceil(2 s)
# + 1, 40): 0..10; 6..min(41, 40) = 6..40; 16..17 (zero length: one frame); 22..32.
# vidB: 10 frames over 10 s: 1..min(10, 10).
ANET_FRAMES = {"vidA_train": [[0, 10], [6, 34], [16, 1], [22, 10]], "vidB_train": [[1, 9]]}

YC2 = {"database": {
    "yc_a": {"duration": 14.0, "subset": "training", "recipe_type": "113", "annotations": [
        {"segment": [0, 3], "id": 0, "sentence": "cut the onion"},
        {"segment": [5, 16], "id": 1, "sentence": "fry it"},
        {"segment": [7, 7], "id": 2, "sentence": "stir"}]},
    "yc_b": {"duration": 10.0, "subset": "validation", "annotations": [
        {"segment": [2, 4], "id": 0, "sentence": "serve"}]},
}}
YC2_META = {
    "yc_a": {"data_key": "yc_a", "split": "train", "duration_sec": 14.0, "segments": [
        {"text": "cut the onion", "start_sec": 0.0, "stop_sec": 3.0},
        {"text": "fry it", "start_sec": 5.0, "stop_sec": 14.0},
        {"text": "stir", "start_sec": 7.0, "stop_sec": 7.0}]},
    "yc_b": {"data_key": "yc_b", "split": "val", "duration_sec": 10.0, "segments": [
        {"text": "serve", "start_sec": 2.0, "stop_sec": 4.0}]},
}
# 7 frames over 14 s (fps 0.5), add_stop_frame 2 (yc2_100m_coot.yaml): 0..ceil(1.5) + 2 = 4;
# 2..min(7 + 2, 7); the zero-length one floor(3.5) = 3..ceil(3.5) + 2 = 6.
YC2_FRAMES = {"yc_a": [[0, 4], [2, 5], [3, 3]]}


def _annotations(folder, files: dict) -> None:
  folder.mkdir(parents=True, exist_ok=True)
  for name, value in files.items():
    (folder / name).write_text(json.dumps(value))


def _features(out, meta, frames: dict, add_stop_frame: int, split: str):
  """Video features of each video (frames[data_key] rows) and text features of the split."""
  rng = np.random.default_rng(0)
  coot_files.write_video_features_h5(out, "vid", {k: rng.normal(size=(n, 3))
                                                  for k, n in frames.items()})
  keys = [k for k, v in meta.items() if v["split"] == split]
  lengths = {k: [2] * len(meta[k]["segments"]) for k in keys}
  coot_files.write_text_features(out, "txt", {k: rng.normal(size=(sum(n), 4))
                                              for k, n in lengths.items()}, lengths)
  return builders.get_source(ml_collections.ConfigDict(dict(
      name="coot", path=str(out), video_features="vid", video_dim=3, text_features="txt",
      text_dim=4, add_stop_frame=add_stop_frame, expand_segments=0)), split)


@pytest.mark.parametrize("dataset", ["activitynet", "youcook2"])
def test_meta_from_the_official_annotations(dataset, tmp_path, capsys):
  folder, out = tmp_path / "annotations", tmp_path / "data"
  if dataset == "activitynet":
    _annotations(folder, {f"{split}.json": value for split, value in ANET.items()})
    # MART's feature durations ship beside them and are not read.
    (folder / "captioning_video_feat_duration.csv").write_text("vidA,21.5,40\n")
    meta, frames, stop, split = ANET_META, ANET_FRAMES, 1, "train"
    lines = ["train: 2 videos, 5 segments; segments 1 reversed (ends swapped), 1 ending past "
             "the video (clamped to its end), 1 of zero length (kept: add_stop_frame frames "
             "when read)", "val_1: 1 videos, 1 segments",
             "val_2: 1 videos, 1 segments; segments 1 ending past the video (clamped to its "
             "end)"]
    videos = {"vidA": 40, "vidB": 10}
  else:
    _annotations(folder, {"youcookii_annotations_trainval.json": YC2})
    meta, frames, stop, split = YC2_META, YC2_FRAMES, 2, "train"
    lines = ["train: 1 videos, 3 segments; segments 1 ending past the video (clamped to its "
             "end), 1 of zero length (kept: add_stop_frame frames when read)",
             "val: 1 videos, 1 segments"]
    videos = {"yc_a": 7, "yc_b": 5}
  printed = []
  code, err = _run(TOOL, [f"--dataset={dataset}", f"--annotations={folder}", f"--out={out}"],
                   capsys, stdout=printed)
  assert code == 0, err
  assert printed[0].splitlines()[:-1] == lines
  assert printed[0].splitlines()[-1].startswith(f"wrote {out / 'meta_all.json'} ({len(meta)} ")
  written = json.loads((out / "meta_all.json").read_text())
  assert written == meta
  # The coot dataset reads it: the segments' frames as COOT's loader computes them.
  source = _features(out, written, videos, stop, split)
  assert source.keys == list(frames)
  for i, key in enumerate(source.keys):
    np.testing.assert_array_equal(source.describe(i)["segments"], frames[key])


def test_bad_annotations_are_one_line(tmp_path, capsys):
  folder = tmp_path / "annotations"
  bad = json.loads(json.dumps(ANET))
  bad["val_1"]["v_vidA"]["sentences"].append("one sentence too many")
  _annotations(folder, {f"{split}.json": value for split, value in bad.items()})
  (tmp_path / "yc2").mkdir()
  (tmp_path / "yc2" / "youcookii_annotations_trainval.json").write_text("{not json")
  cases = [
      (["--dataset=activitynet", f"--annotations={folder}"],
       ("val_1.json, 'v_vidA'", "'timestamps' and 'sentences'")),
      (["--dataset=youcook2", f"--annotations={folder}"],
       ("no youcookii_annotations_trainval.json there",)),
      (["--dataset=youcook2", f"--annotations={tmp_path / 'yc2'}"],
       ("youcookii_annotations_trainval.json: not JSON",)),
      (["--dataset=activitynet", f"--annotations={tmp_path / 'none'}"],
       ("--annotations=", "no such directory")),
  ]
  for argv, words in cases:
    code, err = _run(TOOL, [*argv, f"--out={tmp_path / 'out'}"], capsys)
    _one_error_line(argv, code, err, words)
  assert not (tmp_path / "out" / "meta_all.json").exists()
