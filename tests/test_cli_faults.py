"""The last tracebacks of the command-line family, each now one line (issue 56, items 8-11,
14, 15), run as a user runs them (a process each) where the process is the point:

- a corrupt index (meta.json, vectors.npy, index.faiss) to `avtext.search_videos` and to
  `avtext.index`: which file, and to delete the index and index again; the index is
  left as it was;
"""
import hashlib
import pathlib
import shutil

import numpy as np

from avtext import index as index_lib
from tests.test_cli_failsoft import run_processes
from tests.test_cli_failsoft import user_env


def _tiny_index(out: pathlib.Path) -> pathlib.Path:
  """An index of 3 videos, 2 clips each, 4 dimensions (no run: the files alone)."""
  clips = np.random.default_rng(0).normal(size=(3, 2, 4)).astype(np.float32)
  index_lib.write(out, ["a.mp4", "b.mp4", "c.mp4"], clips, [[1, 2]] * 3,
                  {"format": index_lib.FORMAT, "run": {}, "videos": str(out.parent)})
  return out


def _digests(directory: pathlib.Path) -> dict:
  return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}


def test_a_corrupt_index_is_one_line_saying_to_index_again(tmp_path):
  good = _tiny_index(tmp_path / "good")
  assert index_lib.VideoIndex(good).search(np.ones((1, 4), np.float32), 2)[1].shape == (1, 2)
  corrupt = {  # (index, its broken file, what the error says of it)
      "meta.json": (b'{"format": "avtext.vid', "meta.json: not JSON"),
      "vectors.npy": (None, "vectors.npy: not a numpy array file"),
      "index.faiss": (None, "index.faiss: not a FAISS index"),
  }
  (tmp_path / "videos").mkdir()
  jobs, before = [], {}
  for name, (data, words) in corrupt.items():
    broken = tmp_path / name.replace(".", "_")
    shutil.copytree(good, broken)
    whole = (broken / name).read_bytes()
    (broken / name).write_bytes(data if data is not None else whole[:len(whole) // 2])
    before[broken] = _digests(broken)
    said = (f"{broken}: a corrupt index ({words}); delete it and index again",
            f"--out={broken}")
    jobs += [(f"search {name}", "avtext.search_videos", [f"--index={broken}", "a dog"], said),
             (f"index {name}", "avtext.index", [f"--workdir={tmp_path / 'run'}",
                                                f"--videos={tmp_path / 'videos'}",
                                                f"--out={broken}"], said)]
  failed = run_processes(jobs, user_env(tmp_path), one_line=True)
  assert not failed, "\n".join(failed)
  for broken, digests in before.items():  # nothing rewritten, nothing removed
    assert _digests(broken) == digests, broken
