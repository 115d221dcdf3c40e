"""`python -m avtext.mine` checks its inputs in the driver before Beam starts (issue 46,
part 4): each bad input is one `error: ...` line naming the flag or file and the fix,
exit 2, in seconds; a seed image that is missing or does not decode is a counted skip in
skipped.jsonl; a run that mines nothing (every seed or video skipped, no clip at tau)
exits non-zero with one line.

The corpus is tiny and built here in about a second (2 videos of 3 s at 16x16, 40 solid
colour seed images); the embedder is the colour histogram, so no model is trained.
"""
import concurrent.futures
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

from avtext import cli
from avtext.data import video_io
from tests.test_train_trainer import REPO

HIST = "callable:avtext.mining.embed:colour_histogram"
COLOURS = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0), (0, 255, 255)]
NUM_SEEDS = 40
BAD_SEEDS = {"seed-03": "missing", "seed-17": "unreadable", "seed-29": "unreadable"}


def _config_json(name: str, variant: str | None) -> str:
  sys.path.insert(0, str(REPO))
  try:
    module = __import__(f"configs.{name}", fromlist=["get_config"])
  finally:
    sys.path.remove(str(REPO))
  config = module.get_config(variant) if variant else module.get_config()
  return config.to_json_best_effort()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  from PIL import Image  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp("mine_inputs")
  videos = root / "videos"
  videos.mkdir()
  fps = 8
  for v in range(2):  # 3 s each: one colour a second
    frames = np.concatenate([np.full((fps, 16, 16, 3), COLOURS[(v + k) % 5], np.uint8)
                             for k in range(3)])
    video_io.write_fault(videos / f"v{v}.mp4", None, frames, fps)
  seeds = root / "seeds"
  seeds.mkdir()
  lines = []
  for i in range(NUM_SEEDS):
    sid = f"seed-{i:02d}"
    png = seeds / f"{sid}.png"
    if BAD_SEEDS.get(sid) != "missing":
      Image.fromarray(np.full((16, 16, 3), COLOURS[i % 4], np.uint8)).save(png)
    lines.append(f"{sid}\t{png.name}\tcolour {i % 4}\n")
  (seeds / "seed-17.png").write_text("this is a text file, not an image\n")
  (seeds / "seed-29.png").write_bytes((seeds / "seed-28.png").read_bytes()[:30])  # cut short
  (seeds / "seeds.tsv").write_text("".join(lines))
  good = "".join(l for l in lines if l.split("\t")[0] not in BAD_SEEDS)
  (seeds / "good.tsv").write_text(good)
  (seeds / "all_bad.tsv").write_text("".join(l for l in lines if l.split("\t")[0] in BAD_SEEDS))
  (seeds / "two_columns.tsv").write_text(good + "seed-x\tseed-00.png\n")
  (seeds / "header.tsv").write_text("seed_id\timage\tcaption\n" + good)
  (seeds / "duplicate.tsv").write_text(good + lines[0])
  np.save(seeds / "features.npy", np.ones((5, 8), np.float32))
  (root / "empty").mkdir()
  bad_videos = root / "bad_videos"
  bad_videos.mkdir()
  for name in ("a.mp4", "b.mkv"):
    (bad_videos / name).write_text("not a video\n")
  for name, (config, variant) in {"caption_run": ("videocc_caption", "tiny"),
                                  "rgb_run": ("synthetic_video_pretrain", None)}.items():
    (root / name).mkdir()
    (root / name / "config.json").write_text(_config_json(config, variant))
  (root / "a_file").write_text("x\n")
  return root


def _mine(args, env) -> tuple[subprocess.CompletedProcess, float]:
  t0 = time.perf_counter()
  proc = subprocess.run([sys.executable, "-m", "avtext.mine", *map(str, args)], cwd=REPO,
                        env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                        timeout=300, check=False)
  return proc, time.perf_counter() - t0


def _assert_one_error_line(what, returncode, err, words, code=2):
  err = err.strip()
  assert returncode == code, (what, returncode, err[-3000:])
  assert "Traceback" not in err, (what, err[-3000:])
  assert len(err.splitlines()) <= 6, (what, err)
  last = err.splitlines()[-1]
  assert last.startswith("error: "), (what, err)
  for word in words:
    assert word in last, (word, what, last)


def test_bad_mining_inputs_are_one_line_exit_2_before_beam(corpus, tmp_path, capsys):
  s, v = corpus / "seeds", corpus / "videos"
  out = tmp_path / "out"
  base = {"seeds": s / "good.tsv", "videos": v, "embedder": HIST, "out": out}
  cases = {  # name: (flags over base, words in the error line)
      "2 columns": ({"seeds": s / "two_columns.tsv"}, ("two_columns.tsv:38", "2 column",
                                                       "3 tab-separated")),
      "header row": ({"seeds": s / "header.tsv"}, ("header.tsv:1", "header row", "remove it")),
      "duplicate id": ({"seeds": s / "duplicate.tsv"}, ("duplicate.tsv:38", "'seed-00'",
                                                        "line 1", "unique")),
      "no seeds file": ({"seeds": s / "nope.tsv"}, ("--seeds=", "no such file")),
      "seeds is a folder": ({"seeds": s}, ("--seeds=", "a directory")),
      "empty videos": ({"videos": corpus / "empty"}, ("--videos=", "no video files",
                                                      "give the folder")),
      "videos is a file": ({"videos": corpus / "a_file"}, ("--videos=", "not a directory")),
      "caption tower": ({"embedder": None, "workdir": corpus / "caption_run"},
                        ("--workdir=", "'captioning'", "rgb+audio", "RGB frames alone")),
      "tower without checkpoint": ({"embedder": None, "workdir": corpus / "rgb_run"},
                                   ("--workdir=", "no checkpoint", "train the run")),
      "not a run": ({"embedder": None, "workdir": corpus / "empty"},
                    ("--workdir=", "not an avtext run")),
      "step not a number": ({"embedder": None, "workdir": corpus / "rgb_run", "step": "abc"},
                            ("--step", "'abc'", "step number")),
      "tau out of range": ({"tau": 1.5}, ("--tau=1.5", "[-1.0, 1.0]")),
      "tau_grid out of range": ({"tau_grid": "0.5,2"}, ("--tau_grid=2.0", "[-1.0, 1.0]")),
      "tau_grid not a number": ({"tau_grid": "0.5,x"}, ("--tau_grid=0.5,x", "no number")),
      "clip_seconds": ({"clip_seconds": 0}, ("--clip_seconds=0", "positive")),
      "image_size": ({"image_size": "224"}, ("--image_size=224", "H,W")),
      "top_k": ({"top_k": 0}, ("--top_k=0", "positive integer")),
      "out is a file": ({"out": corpus / "a_file"}, ("--out=", "a file, not a directory")),
      "embedder module": ({"embedder": "callable:no_such_module:f"},
                          ("--embedder=", "no_such_module", "importable")),
      "embedder kind": ({"embedder": "colour_histogram"}, ("--embedder=",
                                                           "callable:MODULE:NAME")),
      "seed features rows": ({"seed_features": s / "features.npy"},
                             ("--seed_features=", "5 rows", "37 seeds")),
  }
  for name, (over, words) in cases.items():
    flags = {**base, **over}
    argv = [f"--{k}={x}" for k, x in flags.items() if x is not None]
    code, _, err = _mine_in_process(argv, capsys)
    _assert_one_error_line(name, code, err, words)
  assert not out.exists()  # nothing was written for any of them
  # The cases, as a user runs them: a process each, one line, exit 2, < 20 s.
  env = dict(os.environ, PYTHONPATH=str(REPO))
  jobs = [(name, [f"--{k}={x}" for k, x in {**base, **cases[name][0]}.items()
                  if x is not None], cases[name][1])
          for name in ("2 columns", "header row", "duplicate id", "empty videos",
                       "caption tower")]
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    done = list(pool.map(lambda job: _mine(job[1], env), jobs))
  for (name, _, words), (proc, seconds) in zip(jobs, done):
    _assert_one_error_line(name, proc.returncode, proc.stderr, words)
    assert seconds < 20, (name, seconds)


def _mine_in_process(argv, capsys) -> tuple[int, str, str]:
  from avtext import mine  # pylint: disable=g-import-not-at-top
  code = 0
  try:
    cli.run(mine.main, mine.FLAGS, ["python -m avtext.mine", *map(str, argv),
                                    "--direct_num_workers=1",
                                    "--direct_running_mode=in_memory"],
            doc=mine.__doc__, known_only=True)
  except SystemExit as e:
    code = e.code
  got = capsys.readouterr()
  return code, got.out, got.err


def test_missing_and_undecodable_seed_images_are_counted_skips(corpus, tmp_path, capsys):
  out = tmp_path / "mined"
  code, stdout, err = _mine_in_process(
      [f"--seeds={corpus / 'seeds' / 'seeds.tsv'}", f"--videos={corpus / 'videos'}",
       f"--embedder={HIST}", f"--out={out}", "--clip_seconds=1", "--tau=0.9",
       "--tau_grid=0.9", "--top_k=2"], capsys)
  assert code == 0, err[-3000:]
  assert "Traceback" not in err
  stats = json.loads((out / "stats.json").read_text())
  assert stats["seeds"] == NUM_SEEDS
  assert stats["seeds_skipped"] == {"missing": 1, "unreadable": 2}
  assert stats["skipped"] == {} and stats["videos_searched"] == 2
  skipped = [json.loads(l) for l in (out / "skipped.jsonl").read_text().splitlines()]
  assert {s["seed_id"]: s["reason"] for s in skipped} == BAD_SEEDS
  assert all(s["path"].endswith(f"{s['seed_id']}.png") for s in skipped)
  assert all(" at 0x" not in s["detail"] for s in skipped)  # the same bytes every run
  rows = [json.loads(l) for l in (out / "matches.jsonl").read_text().splitlines()]
  mined = {r["seed_id"] for r in rows}
  # Every good seed's colour is in a video: each of the 37 matched, none of the 3.
  assert mined == {f"seed-{i:02d}" for i in range(NUM_SEEDS)} - set(BAD_SEEDS)
  assert "37/40 seeds" in stdout and "missing" in stdout


@pytest.mark.parametrize("case", ["every seed skipped", "every video skipped",
                                  "nothing at tau"])
def test_a_run_that_mines_nothing_exits_non_zero_with_one_line(corpus, tmp_path, capsys,
                                                               case):
  seeds, videos, tau = corpus / "seeds" / "good.tsv", corpus / "videos", "0.9"
  words = {"every seed skipped": ("every seed image was skipped", "skipped.jsonl"),
           "every video skipped": ("every video was skipped", "skipped.jsonl"),
           "nothing at tau": ("no clip matched at --tau=1.0", "lower --tau")}[case]
  if case == "every seed skipped":
    seeds = corpus / "seeds" / "all_bad.tsv"
  elif case == "every video skipped":
    videos = corpus / "bad_videos"
  else:
    tau, videos = "1.0", corpus / "videos"
    seeds = corpus / "seeds" / "shifted.tsv"  # colours no video shows
    if not seeds.exists():
      seeds.write_text("s0\tgrey.png\tgrey\n")
      from PIL import Image  # pylint: disable=g-import-not-at-top
      Image.fromarray(np.full((16, 16, 3), 128, np.uint8)).save(seeds.parent / "grey.png")
  code, stdout, err = _mine_in_process(
      [f"--seeds={seeds}", f"--videos={videos}", f"--embedder={HIST}",
       f"--out={tmp_path / 'o'}", "--clip_seconds=1", f"--tau={tau}", f"--tau_grid={tau}"],
      capsys)
  assert code == 1, err[-3000:]
  assert '"csv"' not in stdout  # no result line: nothing was mined
  last = err.strip().splitlines()[-1]
  assert last.startswith("error: ") and "Traceback" not in err, err[-3000:]
  for word in words:
    assert word in last, (word, last)
  assert (tmp_path / "o" / "skipped.jsonl").exists()  # the outputs say what was skipped


@pytest.mark.slow  # a whole mining run with Beam's worker processes (~30 s quiet, minutes loaded)
def test_a_successful_mine_is_quiet_and_says_where_its_results_are(corpus, tmp_path):
  out = tmp_path / "mined"
  proc, _ = _mine([f"--seeds={corpus / 'seeds' / 'good.tsv'}", f"--videos={corpus / 'videos'}",
                   f"--embedder={HIST}", f"--out={out}", "--clip_seconds=1", "--tau=0.9",
                   "--tau_grid=0.9"], dict(os.environ, PYTHONPATH=str(REPO)))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert len(proc.stderr.strip().splitlines()) <= 2, proc.stderr  # no Beam / worker INFO
  last = json.loads(proc.stdout.strip().splitlines()[-1])
  assert last == {"csv": f"{out}/videocc.csv", "dataset": f"{out}/dataset.json"}
  assert not (out / "run.lock").exists()
