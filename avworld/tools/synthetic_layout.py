r"""Write the synthetic world in the file layout of a real dataset (tests, demos, trying a
config without the download).

    python -m avworld.tools.synthetic_layout --layout=msrvtt --out=DIR \
        [--num_train=64 --num_val=16 --num_test=32] [--faults=missing,empty,...]

Layouts and faults: `avworld.layouts` (LAYOUTS, FAULTS). The directory
then reads as that dataset: --config.dataset.name=<layout> --config.dataset.path=DIR.
"""
from absl import flags

from avtext import cli
from avtext import errors
from avworld import layouts
from avworld import world

FLAGS = flags.FlagValues()
_LAYOUT = flags.DEFINE_enum("layout", None, list(layouts.LAYOUTS), "the dataset whose "
                            "layout to write", flag_values=FLAGS)
_OUT = cli.DEFINE_path("out", None, "the directory to write", flag_values=FLAGS)
_NUM_TRAIN = flags.DEFINE_integer("num_train", 64, "training videos", flag_values=FLAGS)
_NUM_VAL = flags.DEFINE_integer("num_val", 16, "validation videos", flag_values=FLAGS)
_NUM_TEST = flags.DEFINE_integer("num_test", 32, "test videos", flag_values=FLAGS)
_HEIGHT = flags.DEFINE_integer("height", 64, "frame height (pixels)", flag_values=FLAGS)
_WIDTH = flags.DEFINE_integer("width", 64, "frame width (pixels)", flag_values=FLAGS)
_DURATION = flags.DEFINE_float("duration_s", 10.0, "seconds per video", flag_values=FLAGS)
_SEED = flags.DEFINE_integer("seed", 0, "the world's seed", flag_values=FLAGS)
_FAULTS = flags.DEFINE_list("faults", [], f"bad files to plant, of {list(layouts.FAULTS)}",
                            flag_values=FLAGS)
flags.mark_flags_as_required(["layout", "out"], flag_values=FLAGS)


def main(argv):
  if len(argv) > 1:
    raise errors.BadInput(f"unexpected arguments {list(argv[1:])}; see --help")
  unknown = sorted(set(_FAULTS.value) - set(layouts.FAULTS))
  if unknown:
    raise errors.BadInput(f"--faults: unknown {unknown}; expected some of {list(layouts.FAULTS)}")
  spec = world.WorldSpec(height=_HEIGHT.value, width=_WIDTH.value, duration_s=_DURATION.value)
  sizes = {"train": _NUM_TRAIN.value, "val": _NUM_VAL.value, "test": _NUM_TEST.value}
  written = layouts.write(_LAYOUT.value, _OUT.value, sizes=sizes, spec=spec, seed=_SEED.value,
                          faults=tuple(_FAULTS.value))
  print(f"wrote the synthetic world as {_LAYOUT.value} under {written.root}: "
        + ", ".join(f"{s} {len(r)}" for s, r in written.items.items()))


if __name__ == "__main__":
  cli.run(main, FLAGS)
