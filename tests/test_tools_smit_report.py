"""avtext.tools.smit_report: which test report of a run it shows, and its table."""
import json

import pytest

from avtext import errors
from avtext.tools import smit_report


def _report(mean_r1: float, oracle: float = 24.4) -> dict:
  out = {}
  for d in ("caption_to_video", "video_to_caption", "mean"):
    for c in smit_report.COLS:
      out[f"test/subset/{d}/{c}"], out[f"test/subset/{d}/{c}_std"] = mean_r1, 0.1
  out["test/subset/oracle_t2v_R@1"] = oracle
  return out


def _run(tmp_path, results: dict):
  tmp_path.mkdir(parents=True, exist_ok=True)
  (tmp_path / "results.json").write_text(json.dumps(results))
  return tmp_path


def test_the_best_checkpoint_on_val_over_the_last_step(tmp_path):
  # A training run tests its last step (300); `--mode=eval --step=best` adds step 200's.
  run = _run(tmp_path, {"200": {"val/mean_R@1": 6.0, **_report(5.0)},
                        "300": {"val/mean_R@1": 5.0, **_report(4.0)},
                        "best": {"metric": "val/mean_R@1", "step": 200, "value": 6.0}})
  step, metrics = smit_report.test_report(run)
  assert (step, metrics["test/subset/mean/R@1"]) == (200, 5.0)


def test_the_newest_when_the_best_step_has_no_test_report(tmp_path):
  run = _run(tmp_path, {"200": {"val/mean_R@1": 6.0}, "300": _report(4.0),
                        "best": {"metric": "val/mean_R@1", "step": 200, "value": 6.0}})
  assert smit_report.test_report(run)[0] == 300
  assert smit_report.test_report(_run(tmp_path / "eval", {"100": _report(3.0)}))[0] == 100


def test_no_test_report_is_a_clear_error(tmp_path):
  with pytest.raises(errors.BadInput, match="no test report"):
    smit_report.test_report(_run(tmp_path, {"100": {"val/mean_R@1": 1.0}}))


def test_table_rows_chance_oracle_and_wer(tmp_path):
  run = _run(tmp_path / "run", {"300": _report(4.0)})
  asr = tmp_path / "asr"
  asr.mkdir()
  (asr / "test.json").write_text(json.dumps(
      {"lm": "trigram of 5000 train captions", "wer": 0.113, "num_words": 12000,
       "num_clips": 1000, "transcripts": []}))
  lines = smit_report.table([("spoken", str(run))], str(asr)).splitlines()
  assert lines[2].startswith("| spoken | 300 | 4.0±0.1 |")
  assert lines[3].startswith("| chance (1k subsets) | | 0.1 | 0.5 | 1.0 |")
  assert lines[4].startswith("| oracle | | 24.4 |")
  assert lines[5] == ("ASR (pocketsphinx, LM: trigram of 5000 train captions) on test: "
                      "WER 11.3 % over 12000 words of 1000 spoken captions")


def test_one_oracle_line_per_set_of_test_clips(tmp_path):
  # The ASR-text model is tested on fewer clips than the others: its own oracle.
  runs = [("spoken", str(_run(tmp_path / "a", {"1": _report(1.0)}))),
          ("language", str(_run(tmp_path / "b", {"1": _report(5.0)}))),
          ("ASR text", str(_run(tmp_path / "c", {"1": _report(4.0, oracle=23.0)})))]
  lines = smit_report.table(runs).splitlines()
  assert lines[-2].startswith("| oracle (spoken, language) | | 24.4 |")
  assert lines[-1].startswith("| oracle (ASR text) | | 23.0 |")
