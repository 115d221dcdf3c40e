"""Reduce-on-plateau and early stopping against hand-worked sequences.

The plateau rule is PyTorch's ReduceLROnPlateau (COOT trains with factor 0.1,
patience 2, cooldown 3); early stopping is XML's `es_cnt > max_es_cnt`.
"""
import math

import ml_collections
import numpy as np
import pytest

from avtext.train import control


def _config(mode="max", factor=0.1, patience=2, cooldown=3, min_lr=0.0, threshold=0.0,
            early=None, lr=1.0):
  return ml_collections.ConfigDict(dict(
      optimizer=dict(learning_rate=lr),
      eval=dict(select=("val/R@1", mode), keep_best=1, early_stopping_patience=early,
                plateau=dict(factor=factor, patience=patience, cooldown=cooldown,
                             min_lr=min_lr, threshold=threshold))))


def _trace(config, values):
  c = control.init(config)
  scales, improved, stops = [], [], []
  for v in values:
    c, events = control.update(c, v, config)
    scales.append(float(c.lr_scale))
    improved.append(events["improved"])
    stops.append(events["stop"])
  return c, scales, improved, stops


def test_plateau_factor_patience_cooldown_by_hand():
  # best 5 at eval 1; evals 2, 3 bad (count 1, 2 = patience, no cut); eval 4 bad
  # (count 3 > 2): scale 0.1, cooldown 3. Evals 5-7 are in cooldown (count
  # reset each time); eval 8 is bad again (count 1), 9 (2), 10 (3 > 2): 0.01.
  values = [5, 4, 4, 4, 4, 4, 4, 4, 4, 4]
  _, scales, improved, _ = _trace(_config(), values)
  np.testing.assert_allclose(scales, [1, 1, 1, .1, .1, .1, .1, .1, .1, .01], rtol=1e-6)
  assert improved == [True] + [False] * 9


def test_plateau_improvement_resets_and_min_lr_floor():
  # An improvement at eval 3 resets the count; min_lr 0.05 of base lr 1 stops at 0.05.
  values = [1, 0.5, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1]
  _, scales, _, _ = _trace(_config(patience=1, cooldown=0, min_lr=0.05), values)
  np.testing.assert_allclose(scales, [1, 1, 1, 1, .1, .1, .05, .05, .05, .05, .05, .05],
                             rtol=1e-6)


def test_min_mode_and_relative_threshold():
  # mode min with threshold 0.1: 9.5 is not below 10 * 0.9, so it is a bad eval
  # for the plateau, but it is a new best for selection and early stopping.
  config = _config(mode="min", patience=0, cooldown=0, threshold=0.1)
  c, scales, improved, _ = _trace(config, [10, 9.5, 8.0])
  assert improved == [True, True, True]
  np.testing.assert_allclose(scales, [1, .1, .1], rtol=1e-6)
  assert float(c.best) == 8.0


def test_early_stopping_after_patience_stale_evals():
  # XML: stop once the evals without a strict gain exceed the patience (2).
  _, _, improved, stops = _trace(_config(factor=None, early=2), [3, 3, 2, 4, 1, 1, 1])
  assert improved == [True, False, False, True, False, False, False]
  assert stops == [False] * 6 + [True]


def test_state_round_trips_and_select_is_validated():
  config = _config(early=1)
  c, _, _, _ = _trace(config, [1, 0, 0])
  assert bool(c.stopped) and int(c.stale_evals) == 2
  assert c.lr_scale.dtype == np.float32 and c.bad_evals.dtype == np.int32
  assert math.isinf(float(control.init(config).best))
  bad = _config()
  bad.eval.select = ("R@1", "max")
  with pytest.raises(ValueError, match="<evaluator>/<metric>"):
    control.init(bad)
  off = _config()
  off.eval.select = None
  with pytest.raises(ValueError, match="need config.eval.select"):
    control.init(off)
