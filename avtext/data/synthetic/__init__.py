"""The synthetic audio-visual-text world: the embedded default dataset.

`world` holds the core (attributes, random streams, frame and audio
rendering) that every variant shares; `captions` says scenes in words and
defines when a caption fits a clip; `clips` is the clip-caption variant,
`spoken_clips` the spoken-caption one (S-MiT), with speech from `tone_speech`
(word tones) or `tts` (espeak); `datasets` registers `synthetic_clips` and
`synthetic_smit` with the dataset registry. The world's ground truth reaches the
rest of the package only through `avtext.data.ground_truth`'s protocols (`truth`,
`mining_corpus.CorpusTruth`): outside this package, only the tools that write
worlds import it (tests/test_architecture.py).
The TFDS builder lives in `tfds_builder` and is not imported here, so using
the source does not pull in TensorFlow. The writers that lay the world out as
a real dataset's files are `layouts` (media datasets), `coot_layout` and
`tvr_layout` (feature files, from the caller's encoders) and `mining_corpus`
(the VideoCC mining corpus); none imports a model.
"""
from avtext.data.synthetic.captions import caption_fits
from avtext.data.synthetic.captions import num_fitting_clips
from avtext.data.synthetic.clips import ClipCaptionSource
from avtext.data.synthetic.clips import DEFAULT_SPLIT_SIZES
from avtext.data.synthetic.clips import oracle_recall_at_1
from avtext.data.synthetic.world import attribute_labels
from avtext.data.synthetic.world import BACKGROUNDS
from avtext.data.synthetic.world import COLOURS
from avtext.data.synthetic.world import example_rng
from avtext.data.synthetic.world import LABEL_GROUPS
from avtext.data.synthetic.world import LABEL_NAMES
from avtext.data.synthetic.world import MOTIONS
from avtext.data.synthetic.world import render_audio
from avtext.data.synthetic.world import render_frames
from avtext.data.synthetic.world import sample_scene
from avtext.data.synthetic.world import Scene
from avtext.data.synthetic.world import SHAPES
from avtext.data.synthetic.world import SOUNDS
from avtext.data.synthetic.world import WorldSpec
