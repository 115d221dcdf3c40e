"""The zip TVCaption's evaluation server takes (standalone_eval/README.md, "Codalab
Submission"): tvc_val_submission.jsonl and tvc_test_public_submission.jsonl at its root,
from the captioning evaluators' exports (TVR's: tests/test_tasks_xml.py's tiny run)."""
import zipfile

import ml_collections

from avtext.evals import submission

LINE = ('{"descs": [{"desc": "phoebe talks ."}], "clip_id": 86603, "ts": [16.48, 33.87], '
        '"vid_name": "friends_s01e03_seg02_clip_19"}\n')


def _config():
  tvc = dict(type="captioning", output_format="tvc")
  return ml_collections.ConfigDict(dict(evals=dict(
      val=dict(split="val", **tvc), test_public=dict(split="test_public", **tvc),
      coco=dict(type="captioning", split="val"))))  # COCO format: not TVC's


def test_tvc_submission_named_and_zipped_as_the_readme_asks(tmp_path):
  captions = tmp_path / "captions"
  captions.mkdir()
  (captions / "val_step6.jsonl").write_text(LINE)
  assert submission.package(_config(), tmp_path, 6, "captioning") is None  # val alone
  (captions / "test_public_step6.jsonl").write_text(LINE.replace("86603", "86604"))
  (captions / "test_public_step3.jsonl").write_text("another step\n")
  zipped = submission.package(_config(), tmp_path, 6, "captioning")
  assert zipped == tmp_path / "submission" / "step6" / "tvc_submission.zip"
  with zipfile.ZipFile(zipped) as archive:
    assert sorted(archive.namelist()) == ["tvc_test_public_submission.jsonl",
                                          "tvc_val_submission.jsonl"]
    assert archive.read("tvc_val_submission.jsonl").decode() == LINE
    assert archive.read("tvc_test_public_submission.jsonl").decode() == LINE.replace(
        "86603", "86604")
  assert (zipped.parent / "tvc_val_submission.jsonl").read_text() == LINE
  # From an evaluator: only with both files written by this process (a val export left by
  # an earlier evaluation of step 6 is not paired with a new test_public one).
  config = _config()
  assert submission.package(config, tmp_path, 6, "captioning",
                            written=captions / "test_public_step6.jsonl") is None
  assert submission.package(config, tmp_path, 6, "captioning",
                            written=captions / "val_step6.jsonl") == zipped
