"""avtext.atomic: a file is replaced whole or not at all, whatever happens mid-write."""
import errno
import json
import os
import pathlib
import signal
import subprocess
import sys

import numpy as np
import pytest

from avtext import atomic

REPO = pathlib.Path(__file__).resolve().parents[1]


def _leftovers(directory):
  return sorted(p.name for p in directory.iterdir() if ".tmp" in p.name)


def test_replaces_the_file_and_leaves_nothing_beside_it(tmp_path):
  path = tmp_path / "new" / "dir" / "results.json"  # parents are made
  atomic.write_json(path, {"b": 1, "a": [1, 2]}, indent=1, sort_keys=True)
  assert path.read_text() == json.dumps({"a": [1, 2], "b": 1}, indent=1, sort_keys=True)
  atomic.write_text(path, "second", durable=False)
  assert path.read_text() == "second"
  atomic.write_bytes(path, b"\x00\xff")
  assert path.read_bytes() == b"\x00\xff"
  assert _leftovers(path.parent) == []


def test_the_temporary_file_keeps_the_suffix_writers_pick_formats_by(tmp_path):
  tmp = atomic.temporary_path(tmp_path / "vectors.npy")
  assert tmp.parent == tmp_path and tmp.suffix == ".npy" and tmp.name.startswith(".vectors.tmp")
  # np.save appends .npy to a name without it: the file written must be the one renamed.
  atomic.replace_with(tmp_path / "vectors.npy", lambda t: np.save(t, np.arange(3)))
  np.testing.assert_array_equal(np.load(tmp_path / "vectors.npy"), [0, 1, 2])
  assert _leftovers(tmp_path) == []


def test_a_writer_that_raises_leaves_the_previous_version(tmp_path):
  path = tmp_path / "meta.json"
  path.write_text("old")

  def half_then_fail(tmp):
    tmp.write_text("half of the n")
    raise KeyError("the caller's bug")

  with pytest.raises(KeyError, match="the caller's bug"):
    atomic.replace_with(path, half_then_fail)
  assert path.read_text() == "old" and _leftovers(tmp_path) == []

  def disk_full(tmp):
    tmp.write_text("half")
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  with pytest.raises(OSError) as failed:
    atomic.replace_with(path, disk_full)
  assert failed.value.errno == errno.ENOSPC
  assert str(failed.value) == (f"[Errno {errno.ENOSPC}] {path}: not written (No space left on "
                               "device); the previous version is unchanged")
  assert path.read_text() == "old" and _leftovers(tmp_path) == []


def test_a_process_killed_mid_write_leaves_the_previous_version(tmp_path):
  """SIGKILL while the new version is half written: the file still reads as the old one
  (a plain write would have truncated it)."""
  path = tmp_path / "results.json"
  path.write_text(json.dumps({"step": 1}))
  code = ("import sys, time, pathlib\nfrom avtext import atomic\n"
          "def write(tmp):\n"
          "  tmp.write_text('{\"step\": ')\n"
          "  print('half', flush=True)\n"
          "  time.sleep(60)\n"
          "atomic.replace_with(pathlib.Path(sys.argv[1]), write)\n")
  proc = subprocess.Popen([sys.executable, "-c", code, str(path)], cwd=REPO,
                          stdout=subprocess.PIPE, text=True)
  try:
    assert proc.stdout.readline().strip() == "half"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
  finally:
    proc.kill()
  assert json.loads(path.read_text()) == {"step": 1}
  # What the killed process left is hidden beside the file, never under its name.
  assert [p.name for p in tmp_path.iterdir() if p.name != path.name] == [
      f".results.tmp{proc.pid}.json"]
