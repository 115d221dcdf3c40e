"""The synthetic audio-visual-text world: the demos' and the tests' dataset.

A package of its own beside `avtext`: it imports avtext, and avtext learns of it only
through its registries' entry points (setup.py: `avtext.datasets` -> `datasets`,
`avtext.worlds` -> this package, whose `truth` and `mining_corpus` register the formats
of the world.json files it writes); no module of avtext imports or names it
(tests/test_architecture.py).

`world` holds the core (attributes, random streams, frame and audio
rendering) that every variant shares; `captions` says scenes in words and
defines when a caption fits a clip; `clips` is the clip-caption variant,
`spoken_clips` the spoken-caption one (S-MiT), with speech from `tone_speech`
(word tones) or `tts` (espeak); `datasets` registers `synthetic_clips` and
`synthetic_smit` with the dataset registry. The world's ground truth reaches avtext
only through `avtext.data.ground_truth`'s protocols (`truth`,
`mining_corpus.CorpusTruth`, the clip sources' `RetrievalOracle`). The tools that write
its files in real layouts are `avworld.tools`; `tower` is their video encoder.
The TFDS builder lives in `tfds_builder` and is not imported here, so using
the source does not pull in TensorFlow. The writers that lay the world out as
a real dataset's files are `layouts` (media datasets), `coot_layout` and
`tvr_layout` (feature files, from the caller's encoders) and `mining_corpus`
(the VideoCC mining corpus); none imports a model.
"""
from avworld.captions import caption_fits
from avworld.captions import num_fitting_clips
from avworld.clips import ClipCaptionSource
from avworld.clips import DEFAULT_SPLIT_SIZES
from avworld.clips import oracle_recall_at_1
from avworld.world import attribute_labels
from avworld.world import BACKGROUNDS
from avworld.world import COLOURS
from avworld.world import example_rng
from avworld.world import LABEL_GROUPS
from avworld.world import LABEL_NAMES
from avworld.world import MOTIONS
from avworld.world import render_audio
from avworld.world import render_frames
from avworld.world import sample_scene
from avworld.world import Scene
from avworld.world import SHAPES
from avworld.world import SOUNDS
from avworld.world import WorldSpec
