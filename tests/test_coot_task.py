"""COOT task and hierarchical evaluator: packing, metrics by hand, a tiny end-to-end run."""
import numpy as np
import pytest

from avtext.evals import hierarchical


def _at(degrees, scale=1.0):
  r = np.radians(np.asarray(degrees, np.float64))
  return scale * np.stack([np.cos(r), np.sin(r)], axis=1)


def test_hierarchical_metrics_by_hand():
  """Unit vectors at known angles: similarities are cos(angle differences).

  videos at 0, 90, 180 deg; paragraphs at 10, 175, 200 deg (pair i = row i).
  v2p ranks: v0 -> p0 first (cos 10); v1: p0 (cos 80) beats p1 (cos 85) -> 2;
  v2: p1 (cos 5) beats p2 (cos 20) -> 2.  p2v ranks: p0 -> 1; p1: v2 (cos 5)
  beats v1 (cos 85) -> 2; p2 -> v2 first (cos 20) -> 1.
  Norms must not matter (the evaluator normalises), so rows are scaled.
  """
  video = _at([0, 90, 180]) * np.array([[1.0], [3.0], [0.5]])
  paragraph = _at([10, 175, 200]) * np.array([[2.0], [1.0], [7.0]])
  r = hierarchical.hierarchical_results(video, paragraph, video, paragraph, ks=(1, 2, 50))
  assert r["v2p_R@1"] == pytest.approx(100 / 3)
  assert r["v2p_R@2"] == pytest.approx(100.0)
  assert r["v2p_MdR"] == 2.0  # COOT: floor(median of 1, 2, 2)
  assert r["v2p_MnR"] == pytest.approx(5 / 3)
  assert r["p2v_R@1"] == pytest.approx(200 / 3)
  assert r["p2v_MdR"] == 1.0
  assert r["p2v_MnR"] == pytest.approx(4 / 3)
  assert r["vp_R@1_mean"] == pytest.approx(50.0)
  assert r["vp_chance_r1"] == pytest.approx(100 / 3)
  assert r["c2s_R@1"] == r["v2p_R@1"] and r["num_clips"] == 3
