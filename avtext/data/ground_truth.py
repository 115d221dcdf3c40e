"""Ground truth: what a data source knows about its items beyond their media and text.

A real dataset knows what its files say (a caption, perhaps a label). A world that made
its items (a procedural generator, such as the demos') also knows what each item shows
and can score a prediction against it: the attribute precision of a caption, the best
reachable retrieval R@1, whether a mined clip shows its seed's caption. Evaluators, tasks,
the mining pipeline and dataset builders ask for that knowledge here, through the
protocols below, and never import the world: a source without ground truth answers None,
and the numbers that need it are not reported (never an error, never a made-up number).

Items carry their ground truth as an 'attributes' dict (`describe(i)["attributes"]`,
handed to evaluators as a host field); a `ClipTruth` reads it. Where to ask:

  of_source(source)      the `ClipTruth` a source offers as its `ground_truth`
                         attribute (a world's clip sources; a `tvc` directory a
                         world wrote, through its world.json)
  of_dataset(dataset)    the `ClipTruth` a registered dataset declares (`declare`),
                         without opening it: e.g. a world dataset's class names
  retrieval_oracle(s)    a source's `RetrievalOracle` (the best reachable R@1, and
                         the groups of queries it scores apart)
  world_meta(directory)  the world.json a world wrote beside its files (None: no world)
  open_world(meta, ...)  that world's ground truth, by the format the file names
                         (`register_world`): a `ClipTruth`, or a `CorpusTruth` for a
                         mining corpus

The worlds themselves live outside avtext: a package registers its datasets and world.json
formats through the entry-point groups `avtext.datasets` and `avtext.worlds`
(`avtext.config_registry`).
"""
import json
import pathlib
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

import ml_collections
import numpy as np

from avtext import config_registry
from avtext.data import builders

WORLD_FILE = "world.json"


@runtime_checkable
class ClipTruth(Protocol):
  """What a world knows of a clip, read from the 'attributes' dict its examples carry."""

  label_names: tuple[str, ...]  # its attribute classes, "group:value"

  def labels(self, attributes: Mapping[str, Any]) -> np.ndarray:
    """float32 [len(label_names)]: the clip's multi-hot attribute labels."""

  def caption_scores(self, captions: Sequence[str],
                     attributes: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Captions against their clips' attributes: 'attribute_precision' and
    'attribute_recall' (%), 'attributes_per_caption'."""


@runtime_checkable
class RetrievalOracle(Protocol):
  """A source that knows the best text-to-video R@1 any model could reach on it."""

  def oracle_recall_at_1(self, subset: Sequence[int] | None = None, *,
                         gallery_is_subset: bool = False) -> float:
    """Best R@1 (%) over the captions of `subset` (None: all) against the whole split,
    or against the subset with `gallery_is_subset`."""

  def query_groups(self, num_queries: int) -> dict[str, tuple[str, Sequence[int]]]:
    """{key: (label, indices)}: groups among the first `num_queries` queries that the
    evaluator scores apart (R@1 beside the oracle's on them, as `<key>_t2v_r1`,
    `<key>_oracle_t2v_r1` and `<key>_num_captions`); `label` names the group in reports.
    {} when the source has none."""


@runtime_checkable
class CorpusTruth(Protocol):
  """A video corpus a world wrote (the mining world's long videos and seed captions)."""

  fps: float
  sample_rate: int

  def render_frames(self, video_id: str, times_s: np.ndarray) -> np.ndarray:
    """uint8 [T, H, W, 3]: the video's frames at `times_s`, as its file was written from."""

  def render_audio(self, video_id: str, start_sample: int, num_samples: int) -> np.ndarray:
    """float32 [<= num_samples]: the video's audio from `start_sample`."""

  def clip_fits(self, video_id: str, seed_id: str, start_s: float, end_s: float) -> bool:
    """Does some frame of [start_s, end_s) of the video show what the seed's caption says?"""


def of_source(source: Any) -> ClipTruth | None:
  """The `ClipTruth` of a source's items, or None (a source that knows only its files)."""
  return getattr(source, "ground_truth", None)


def declare(truth: ClipTruth) -> Callable:
  """Decorator of a dataset factory (`builders.register_dataset`): every source it opens
  knows `truth`, so `of_dataset` answers without opening one."""

  def decorate(factory):
    factory.ground_truth = truth
    return factory
  return decorate


def of_dataset(dataset_config: ml_collections.ConfigDict) -> ClipTruth | None:
  """The `ClipTruth` dataset `dataset_config.name` declares, or None."""
  factory = builders.DATASETS.get(dataset_config.name, where="config.dataset.name")
  return getattr(factory, "ground_truth", None)


def retrieval_oracle(source: Any) -> RetrievalOracle | None:
  """The source as a `RetrievalOracle`, or None when it does not know the oracle."""
  return source if callable(getattr(source, "oracle_recall_at_1", None)) else None


# Every `@register_world("<format>/", prefix=True)` in the packages of the entry-point
# group `avtext.worlds`: a factory `meta -> ground truth` of the world whose world.json
# names that format.
WORLDS = config_registry.Registry(
    "world", (), "register_world",
    message="{where}={name!r} names no known world; known formats: {joined}")
register_world = WORLDS.register


def world_meta(directory: str | pathlib.Path) -> dict | None:
  """The world.json a world wrote into `directory`, or None (files of the real world; a
  remote directory, which no world writes)."""
  if "://" in str(directory):
    return None
  path = pathlib.Path(directory) / WORLD_FILE
  return json.loads(path.read_text()) if path.is_file() else None


def open_world(meta: Mapping[str, Any], *, where: str, kind: type) -> Any:
  """The ground truth (a `kind`: `ClipTruth` or `CorpusTruth`) of the world `meta` (its
  world.json) describes; `where` names the file in errors."""
  truth = WORLDS.get(meta.get("format"), where=f"{where}: format")(meta)
  if not isinstance(truth, kind):
    raise TypeError(f"{where}: the world {meta.get('format')!r} knows no {kind.__name__} "
                    f"(its ground truth is a {type(truth).__name__})")
  return truth
