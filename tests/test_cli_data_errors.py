"""Real data's mistakes reach the user of `python -m avtext.main` as one `error:` line
(issue 56, items 3 and 6), each as its own process, before any step is trained:

- a bad line of an annotation jsonl, a reversed timestamp, a corpus video without
  features, a feature file of the wrong shape: the file and the line or key;
- a selection metric on a split without references (TVC's test_public as val): the
  split and the missing field, and how to train without selection;
- `--mode=eval --step=best` on a run that never chose a best: why;
- `avtext.tools.caption_vocab` on a train split without descriptions, `avtext.tools.tvr_eval`
  on a ground truth without moments (TVR's released test_public) or a submission that is
  not one (items 4, 5, 12).

The datasets are the tests' tiny synthetic TVR / TVC directories (official layouts),
each copied and broken in one place.
"""
import json
import pathlib
import shutil

import h5py
import ml_collections
import numpy as np
import pytest

from avtext.data import builders
from avtext.data.builders import tvc
from avtext.data.builders import tvr
from avtext.text import vocab as vocab_lib
from avtext.train import rundir
from avworld import tvr_layout
from tests.test_cli_failsoft import _one_error_line
from tests.test_cli_failsoft import _run
from tests.test_cli_failsoft import run_processes
from tests.test_cli_failsoft import user_env
from tests.test_tasks_mmt import _dataset_config as tvc_config
from tests.test_tasks_mmt import write_synthetic_tvc
from tests.test_tasks_xml import _dataset_config as tvr_config
from tests.test_tasks_xml import write_synthetic_tvr
from tests.test_train_trainer import REPO

XML = ["--config=configs/xml_tvr.py:tiny", "--config.dataset.video_dim=8",
       "--config.dataset.sub_dim=6", "--config.dataset.query_dim=6"]


def _mmt(vocab) -> list[str]:
  return ["--config=configs/mmt_tvc.py:tiny", "--config.dataset.video_dim=8",
          "--config.model.video_dim=8", f"--config.model.vocab={vocab}"]


def _copy(src: pathlib.Path, dst: pathlib.Path, edit) -> pathlib.Path:
  shutil.copytree(src, dst)
  edit(dst)
  return dst


def _edit_line(file: pathlib.Path, n: int, edit) -> None:
  """Line n (from 1) of a jsonl replaced by edit(its text)."""
  lines = file.read_text().splitlines()
  lines[n - 1] = edit(lines[n - 1])
  file.write_text("\n".join(lines) + "\n")


def _reverse_ts(line: str) -> str:
  row = json.loads(line)
  row["ts"] = row["ts"][::-1]
  return json.dumps(row)


def _wrong_shape(file: pathlib.Path, key: str) -> None:
  with h5py.File(file, "a") as h5:
    del h5[key]
    h5[key] = np.zeros((3, 8, 2), np.float32)


def _drop_key(file: pathlib.Path, key: str) -> None:
  with h5py.File(file, "a") as h5:
    del h5[key]


def _without_descs(file: pathlib.Path) -> None:
  rows = [json.loads(l) for l in file.read_text().splitlines()]
  file.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "descs"}) + "\n"
                          for r in rows))


def test_data_errors_and_a_selection_without_references_are_one_line(tmp_path):
  tvc_dir = write_synthetic_tvc(tmp_path / "tvc")
  (tmp_path / "tvr").mkdir()
  tvr_dir = write_synthetic_tvr(tmp_path / "tvr")
  vocab = tmp_path / "w.json"
  vocab_lib.WordVocab.build(["a word"], min_count=0).save(vocab)
  val = json.loads(tvr.annotation_path(tvr_dir, "val").read_text().splitlines()[0])
  features = f"video_feature/{tvr_layout.VIDEO_FEATURES}.h5"
  reversed_ts = _copy(tvr_dir, tmp_path / "reversed", lambda d: _edit_line(
      tvr.annotation_path(d, "train"), 3, _reverse_ts))
  no_video = _copy(tvr_dir, tmp_path / "no_video", lambda d: _drop_key(d / features,
                                                                        val["vid_name"]))
  bad_line = _copy(tvc_dir, tmp_path / "bad_line", lambda d: _edit_line(
      tvc.annotation_path(d, "val"), 2, lambda line: line[:40]))
  shape = _copy(tvc_dir, tmp_path / "shape", lambda d: _wrong_shape(d / features,
                                                                      val["vid_name"]))
  blind = _copy(tvc_dir, tmp_path / "blind", lambda d: _without_descs(
      tvc.annotation_path(d, "test_public")))
  no_best = _fake_run(tmp_path / "no_best", vocab)
  no_descs = _copy(tvc_dir, tmp_path / "no_descs", lambda d: _without_descs(
      tvc.annotation_path(d, "train")))
  hidden = tmp_path / "tvr_test_public_release.jsonl"  # as released: no vid_name, no ts
  hidden.write_text('{"desc_id": 90200, "desc": "Phoebe puts one of her ponytails in her '
                    'mouth."}\n')
  garbage = tmp_path / "garbage.json"
  garbage.write_bytes(bytes(range(256)))
  def run(data):  # a workdir of its own: the processes run side by side
    return [f"--config.dataset.path={data}", f"--workdir={tmp_path / 'runs' / data.name}"]

  jobs = [  # (what, program, argv, words of the error line)
      ("a reversed timestamp", "avtext.main", [*XML, *run(reversed_ts)],
       ("tvr_train_release.jsonl, line 3: ts must be [start, end]",)),
      ("a corpus video without features", "avtext.main", [*XML, *run(no_video)],
       (features, "no video features for 1 videos of the val corpus", val["vid_name"])),
      ("a line that is not JSON", "avtext.main", [*_mmt(vocab), *run(bad_line)],
       ("tvc_val_release.jsonl, line 2: not JSON",)),
      ("a feature of the wrong shape", "avtext.main", [*_mmt(vocab), *run(shape)],
       (features, f"key '{val['vid_name']}'", "got shape [3, 8, 2]")),
      ("test_public as val", "avtext.main",
       [*_mmt(vocab), *run(blind), "--config.evals.val.split=test_public"],
       ("config.eval.select='val/CIDEr-D'", "split 'test_public'",
        "tvc_test_public_release.jsonl has no 'descs'", "--config.eval.select=()")),
      ("--step=best without a best", "avtext.main",
       ["--mode=eval", "--step=best", f"--workdir={no_best}"],
       ("--step=best:", "holds no best checkpoint", "'val' ran but never gave "
        "'val/CIDEr-D'", "leave --step out")),
      ("a vocabulary without descriptions", "avtext.tools.caption_vocab",
       [*_mmt(vocab), f"--config.dataset.path={no_descs}", f"--out={tmp_path / 'v.json'}"],
       ("no descriptions in the train split", "tvc_train_release.jsonl has no 'descs'")),
      ("a ground truth without moments", "avtext.tools.tvr_eval",
       [f"--submission={garbage}", f"--ground_truth={hidden}"],
       ("--ground_truth=", "cannot be scored", "no 'vid_name' / 'ts'")),
      ("a submission that is not one", "avtext.tools.tvr_eval",
       [f"--submission={garbage}", f"--ground_truth={tvr.annotation_path(tvr_dir, 'val')}"],
       ("--submission=", "not a TVR submission", "video2idx")),
  ]
  failed = run_processes(jobs, user_env(tmp_path), one_line=True)
  assert not failed, "\n".join(failed)
  assert not (tmp_path / "runs").exists() and not (tmp_path / "v.json").exists()


def _fake_run(workdir: pathlib.Path, vocab) -> pathlib.Path:
  """A run directory with a checkpoint step folder and results, but no best checkpoint:
  its val split gave no CIDEr-D (main answers before it reads the checkpoint)."""
  import sys  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, str(REPO))
  try:
    from configs import mmt_tvc  # pylint: disable=g-import-not-at-top
  finally:
    sys.path.remove(str(REPO))
  config = mmt_tvc.get_config("tiny")
  config.model.vocab = str(vocab)
  (workdir / rundir.LATEST_DIR / "6").mkdir(parents=True)
  (workdir / rundir.CONFIG_FILE).write_text(config.to_json_best_effort())
  rundir.write_json(workdir / rundir.RESULTS_FILE, {"6": {"val/num_videos": 12}})
  return workdir


def test_why_a_run_has_no_best_checkpoint(tmp_path):
  config = ml_collections.ConfigDict(dict(eval=dict(select=("val/CIDEr-D", "max"))))
  assert rundir.no_best_reason(tmp_path, config) == (
      "no evaluation of 'val/CIDEr-D' (config.eval.select) has finished yet")
  rundir.write_json(tmp_path / rundir.RESULTS_FILE, {"3": {"val/num_videos": 4}})
  assert "'val' ran but never gave 'val/CIDEr-D'" in rundir.no_best_reason(tmp_path, config)
  assert rundir.no_best_reason(tmp_path, ml_collections.ConfigDict(dict(eval=dict(
      select=())))) == "it selects none (config.eval.select is unset)"
  (tmp_path / rundir.BEST_DIR / "3").mkdir(parents=True)
  assert rundir.no_best_reason(tmp_path, config) is None


def test_files_of_the_wrong_kind_are_one_line(tmp_path, capsys):
  """Item 12: a config.json of valid JSON but not a config, a binary --captions or
  --queries file, an empty or garbage .npz checkpoint (never numpy's allow_pickle
  advice: loading a pickle runs its code)."""
  binary = tmp_path / "binary.txt"
  binary.write_bytes(bytes(range(128, 256)))
  (tmp_path / "empty.npz").write_bytes(b"")
  (tmp_path / "garbage.npz").write_bytes(bytes(range(256)) * 4)
  video = tmp_path / "clip.mp4"
  video.write_bytes(b"\0")
  for shape in ("[1, 2]", '{"task": 3}', '{"task": "avr", "model": [1]}'):
    (tmp_path / "run" / rundir.CONFIG_FILE).parent.mkdir(exist_ok=True)
    (tmp_path / "run" / rundir.CONFIG_FILE).write_text(shape)
    with pytest.raises(rundir.RunFileError, match=r"config.json: valid JSON but not an "
                       r"avtext config \((the whole file|'task'|'model') is not"):
      rundir.read_config(tmp_path / "run" / rundir.CONFIG_FILE)
  cases = [
      ("avtext.main", ["--mode=eval", f"--workdir={tmp_path / 'run'}"],
       ("config.json: valid JSON but not an avtext config", "'model'")),
      ("avtext.search_videos", [f"--index={tmp_path}", f"--video={video}",
                                f"--captions={binary}"],
       ("--captions=", "not a text file", "one caption per line")),
      ("avtext.search_moments", [f"--workdir={tmp_path / 'run'}", f"--corpus={tmp_path}",
                                 f"--queries={binary}"],
       ("--queries=", "not a text file", "one query per line")),
      ("avtext.import_checkpoint", ["--system=xml", f"--checkpoint={tmp_path / 'empty.npz'}",
                                    f"--out={tmp_path / 'imported'}"],
       ("empty.npz: not an .npz of arrays (the file is empty)",)),
      ("avtext.import_checkpoint", ["--system=xml", f"--checkpoint={tmp_path / 'garbage.npz'}",
                                    f"--out={tmp_path / 'imported'}"],
       ("garbage.npz: not an .npz of arrays", "numpy.savez")),
  ]
  for program, argv, words in cases:
    code, err = _run(program, argv, capsys)
    _one_error_line(f"{program} {argv}", code, err, words)
    assert "allow_pickle" not in err and "pickle.load" not in err, err
  assert not (tmp_path / "imported").exists()


def test_a_split_without_references_says_what_it_lacks(tmp_path):
  """TVR's released test_public (desc_id and desc only) and TVC's (no descs): the source's
  `missing_references` names the file and the field; a split with them has None."""
  (tmp_path / "tvr").mkdir()
  tvr_dir = write_synthetic_tvr(tmp_path / "tvr")
  file = tvr.annotation_path(tvr_dir, "test_public")
  file.write_text("".join(json.dumps({"desc_id": r["desc_id"], "desc": r["desc"]}) + "\n"
                          for r in map(json.loads, file.read_text().splitlines())))
  assert builders.get_source(tvr_config(tvr_dir), "val").missing_references is None
  assert builders.get_source(tvr_config(tvr_dir), "test_public").missing_references == (
      f"{file} has no 'vid_name' / 'ts' (the moments)")
  tvc_dir = write_synthetic_tvc(tmp_path / "tvc")
  _without_descs(tvc.annotation_path(tvc_dir, "test_public"))
  assert builders.get_source(tvc_config(tvc_dir), "val").missing_references is None
  assert builders.get_source(tvc_config(tvc_dir), "test_public").missing_references == (
      f"{tvc.annotation_path(tvc_dir, 'test_public')} has no 'descs'")
