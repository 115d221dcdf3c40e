"""The synthetic world's ground truth, behind `avtext.data.ground_truth`'s protocols.

`WORLD` is the world's `ground_truth.ClipTruth`: the attribute labels of a clip
(`world.attribute_labels` over `world.LABEL_NAMES`) and the attribute precision / recall
of captions (`captions.statement_precision_recall`). The world's clip sources offer it as
their `ground_truth`, its datasets declare it (`datasets`), and files the world writes
carry it by name: a world.json of format `FORMAT` (`write_world_file`, e.g. beside the
TVC annotations of `tvr_layout`) opens it through `ground_truth.open_world`.
"""
from __future__ import annotations

import json
import pathlib
from typing import Any, Mapping, Sequence

import numpy as np

from avtext import atomic
from avtext.data import ground_truth
from avworld import captions
from avworld import world

FORMAT = 'avtext.synthetic_world/1'


class WorldTruth:
  """The clip world's `ground_truth.ClipTruth` (module docstring)."""

  label_names = world.LABEL_NAMES

  def labels(self, attributes: Mapping[str, Any]) -> np.ndarray:
    return world.attribute_labels(attributes)

  def caption_scores(self, texts: Sequence[str],
                     attributes: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    return captions.statement_precision_recall(texts, attributes)

  def __repr__(self) -> str:
    return 'WorldTruth()'


WORLD = WorldTruth()


@ground_truth.register_world('avtext.synthetic_world/', prefix=True)
def open_world(meta: Mapping[str, Any]) -> WorldTruth:
  del meta  # one world, one format so far
  return WORLD


def write_world_file(directory: str | pathlib.Path) -> None:
  """Marks `directory` as written by this world (its `ground_truth.WORLD_FILE`)."""
  path = pathlib.Path(directory) / ground_truth.WORLD_FILE
  atomic.write_text(path, json.dumps({'format': FORMAT}, indent=1) + '\n', durable=False)
