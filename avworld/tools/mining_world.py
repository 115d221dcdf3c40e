r"""Write the synthetic mining world as files to mine (`make demo-mining`).

    python -m avworld.tools.mining_world --out=DIR --num_seeds=2000 --num_videos=200 \
        [--faults=truncated,empty,not_video,audio_only,no_audio,short] [--seed_caption_motion]

The layout and the faults: `avworld.mining_corpus`. Writing is
deterministic (byte-identical files from the same flags) and skips files that exist
with the same world.json.
"""
from absl import flags

from avtext import cli
from avtext import errors
from avworld import mining
from avworld import mining_corpus
from avworld import world

FLAGS = flags.FlagValues()
_OUT = cli.DEFINE_path("out", None, "the directory to write (seeds/, videos/)",
                       flag_values=FLAGS)
_NUM_SEEDS = flags.DEFINE_integer("num_seeds", 2000, "seed images with captions",
                                  lower_bound=1, flag_values=FLAGS)
_NUM_VIDEOS = flags.DEFINE_integer("num_videos", 200, "corpus videos", lower_bound=1,
                                   flag_values=FLAGS)
_RATE = flags.DEFINE_float("seed_scene_rate", 0.3, "the share of videos with a seed's "
                           "scene planted in them", flag_values=FLAGS)
_SEED = flags.DEFINE_integer("seed", 0, "the world's seed", flag_values=FLAGS)
_MOTION = flags.DEFINE_bool("seed_caption_motion", False, "seed captions may state the "
                            "objects' motion, which a still does not show (the world's earlier "
                            "captions; by default they state what the image shows)",
                            flag_values=FLAGS)
_FAULTS = flags.DEFINE_list("faults", [], "bad files that replace the last videos, of "
                            f"{list(mining_corpus.FAULTS)}", flag_values=FLAGS)
_WORKERS = flags.DEFINE_integer("workers", 2, "processes writing videos", lower_bound=1,
                                flag_values=FLAGS)
flags.mark_flag_as_required("out", flag_values=FLAGS)


def main(argv):
  if len(argv) > 1:
    raise errors.BadInput(f"unexpected arguments {list(argv[1:])}; see --help")
  unknown = sorted(set(_FAULTS.value) - set(mining_corpus.FAULTS))
  if unknown:
    raise errors.BadInput(f"--faults: unknown {unknown}; expected some of "
                          f"{list(mining_corpus.FAULTS)}")
  w = mining.MiningWorld(num_seeds=_NUM_SEEDS.value, num_videos=_NUM_VIDEOS.value,
                         seed_scene_rate=_RATE.value, seed=_SEED.value,
                         seed_caption_motion=_MOTION.value,
                         spec=world.WorldSpec(height=64, width=64, fps=25, duration_s=10.0))
  mining_corpus.write(_OUT.value, w, tuple(_FAULTS.value), workers=_WORKERS.value)


if __name__ == "__main__":
  cli.run(main, FLAGS)
