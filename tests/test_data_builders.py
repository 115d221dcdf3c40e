"""The dataset registry: lookup, lazy imports, error texts, custom registrations."""
import json
import subprocess
import sys

import ml_collections
import pytest

from avtext.data import builders
from avworld import ClipCaptionSource


def synthetic(**fields):
  return ml_collections.ConfigDict(dict(name="synthetic_clips", num_train=3, num_eval=2,
                                        world={"height": 32, "width": 32}, **fields))


@pytest.fixture
def scratch_registry():
  """Registrations made in a test vanish after it."""
  saved = builders.DATASETS.snapshot()
  yield
  builders.DATASETS.restore(saved)


def test_synthetic_lookup_sizes_and_split_alias():
  train = builders.get_source(synthetic(), "train")
  val = builders.get_source(synthetic(), "validation")
  assert isinstance(train, ClipCaptionSource) and train.kind == builders.CLIPS
  assert (len(train), train.split, len(val), val.split) == (3, "train", 2, "val")
  assert train.spec.height == 32
  # Same clips as the plain source: the registry adds nothing but `kind`.
  assert val.describe(1)["caption"] == ClipCaptionSource(
      "val", num_examples=2, spec=train.spec).describe(1)["caption"]


def test_lookup_imports_only_the_named_dataset():
  script = """
import json, sys
import ml_collections
from avtext.data import builders
before = sorted(m for m in sys.modules if m.startswith("avtext.data.builders."))
builders.get_source(ml_collections.ConfigDict(dict(name="synthetic_clips", num_eval=2)), "test")
heavy = ("tensorflow_datasets", "tensorflow", "h5py", "array_record", "avtext.data.array_store",
         "avtext.data.builders.feature_stores", "avtext.data.builders.tfds_clips")
print(json.dumps({"before": before, "synthetic": "avworld.datasets" in sys.modules,
                  "heavy": [m for m in heavy if m in sys.modules]}))
"""
  out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       check=True)
  got = json.loads(out.stdout.strip().splitlines()[-1])
  assert got == {"before": [], "synthetic": True, "heavy": []}


def test_unknown_name_lists_registered_names():
  with pytest.raises(ValueError) as e:
    builders.get_source(ml_collections.ConfigDict({"name": "nope"}), "train")
  message = str(e.value)
  assert message.startswith("config.dataset.name='nope' is not a registered dataset")
  for name in ("synthetic_clips", "videocc3m", "msrvtt", "features:hdf5", "features:npz",
               "features:array_record", "tfds:<name>"):
    assert name in message
  with pytest.raises(ValueError, match="not a registered dataset"):  # a bare prefix
    builders.get_source(ml_collections.ConfigDict({"name": "tfds:"}), "train")


def test_real_dataset_without_its_files_says_what_to_prepare(tmp_path):
  with pytest.raises(FileNotFoundError) as e:
    builders.get_source(ml_collections.ConfigDict({"name": "msrvtt"}), "test")
  message = str(e.value)
  assert message.startswith("config.dataset.path: set it to your MSR-VTT directory")
  assert "MSRVTT_JSFUSION_test.csv" in message and "No download at hand" in message
  with pytest.raises(FileNotFoundError, match=r"MSRVTT_JSFUSION_test.csv: not found"):
    builders.get_source(ml_collections.ConfigDict({"name": "msrvtt", "path": str(tmp_path)}),
                        "test")


def test_tfds_prefix_errors():
  with pytest.raises(ValueError, match=r"'tfds:foo/bar' needs config.dataset.data_dir"):
    builders.get_source(ml_collections.ConfigDict({"name": "tfds:foo/bar"}), "train")


def test_custom_registration_prefix_and_kind_check(scratch_registry):
  seen = []

  class Source:
    kind = builders.FEATURES

    def __len__(self):
      return 1

  @builders.register_dataset("fake:", prefix=True)
  def fake(dataset, split):
    seen.append((dataset.name, split))
    return Source()

  @builders.register_dataset("kindless")
  def kindless(dataset, split):
    del dataset, split
    return object()

  config = ml_collections.ConfigDict({"name": "fake:abc", "other": 1})
  assert builders.get_source(config, "validation").kind == "features"
  assert seen == [("fake:abc", "val")]
  assert "fake:<name>" in builders.registered_names()
  with pytest.raises(TypeError, match=r"'kindless'.*returned object with kind=None"):
    builders.get_source(ml_collections.ConfigDict({"name": "kindless"}), "train")
  with pytest.raises(ValueError, match="'kindless' is already registered by"):
    builders.register_dataset("kindless")(fake)
