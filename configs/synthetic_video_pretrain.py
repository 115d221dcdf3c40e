r"""Supervised pretraining of the demo's RGB tower on the synthetic world's labels.

    python -m avtext.main --config=configs/synthetic_video_pretrain.py \
        --workdir=workdirs/demo/video_pretrain
    python -m avtext.main --config=configs/videocc_avr.py:demo --workdir=workdirs/demo/avr \
        --config.init_from.workdir=workdirs/demo/video_pretrain

VideoCC (§5.2) does not train MBT from scratch: it starts from a ViT
pretrained on ImageNet-21k. The synthetic world has no ImageNet, so this stage
plays that part: the same RGB tower as `videocc_avr.py:demo` (same data
sampling, same MBT sizes), trained on the world's attribute labels. `make demo`
runs it first and hands its `video/rgb/` parameters to the AVR run
(`config.init_from`).

The objective is one softmax per attribute with shape weighted x5, not the
ImageNet-21k ViTs' sigmoid over all labels (`--config.loss.name=sigmoid_xent`),
and the steps are many and small (3600 x 8 clips): with the sigmoid loss and
300 x 64 clips the tower learnt every attribute but shape (32 %, chance 25 %),
and every demo downstream was blind to it (BENCHMARKS.md "Stage 1: a tower that
sees shape").

Only the RGB tower is pretrained (VideoCC's audio tower also starts from the
image ViT; here the audio tower learns its easier sounds from scratch).
Labels are from the train split only; the retrieval test split is disjoint.

Variants: (none) the demo's tower; hybrid: `videocc_avr.py:demo,hybrid`'s tower (a conv
stem before the patches); tiny: the tiny AVR config's tower (tests).
"""

import ml_collections

from configs import common
from configs import videocc_avr


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variants = common.parse_variants(arg, ("tiny", "hybrid"),
                                        "configs/synthetic_video_pretrain.py")
  tiny = "tiny" in variants
  tower = ["tiny" if tiny else "demo"] + sorted(variants - {"tiny"})
  avr = videocc_avr.get_config(",".join(tower))

  config = ml_collections.ConfigDict()
  config.task = "video_cls"
  config.seed = 0
  config.num_devices = None
  # Same world, sampling and tower as the AVR run it initializes.
  config.dataset = avr.dataset
  config.data = avr.data
  config.model = ml_collections.ConfigDict()
  config.model.name = "video_classifier"
  config.model.num_classes = 26  # the world's attribute labels (synthetic.LABEL_NAMES)
  config.model.video = avr.model.video
  config.model.video.modalities = "rgb"

  # One softmax per attribute (shape, colour, motion, background, count) over the values
  # present, shape weighted x5 and sound 0 (this tower has no audio): under the sigmoid
  # loss of the ImageNet-21k ViTs the easy attributes take the gradient and shape stays
  # near chance in the demo's budget (BENCHMARKS.md "Stage 1: a tower that sees shape").
  config.loss = ml_collections.ConfigDict()
  config.loss.name = "group_softmax_xent"  # or "sigmoid_xent" (ImageNet-21k ViTs)
  config.loss.group_weights = ml_collections.ConfigDict(dict(shape=5.0, sound=0.0))
  config.loss.focal_gamma = 0.0

  config.optimizer = ml_collections.ConfigDict()
  config.optimizer.name = "adamw"
  config.optimizer.learning_rate = 1e-3
  config.optimizer.weight_decay = 0.01
  config.optimizer.schedule = "cosine"
  config.optimizer.warmup_epochs = None
  config.optimizer.warmup_steps = 50
  config.optimizer.grad_clip_norm = 1.0
  config.optimizer.frozen = ()
  config.optimizer.lr_multipliers = ()

  config.init_from = ml_collections.ConfigDict()
  config.init_from.workdir = ml_collections.config_dict.placeholder(str)
  config.init_from.step = ml_collections.config_dict.placeholder(str)
  config.init_from.params = (("video/", "video/"),)

  # Logging and eval as the AVR run; many small steps (the tower learns shape by updates,
  # not by clips: BENCHMARKS.md).
  config.train = avr.train
  config.train.keep_checkpoints = 1
  if not tiny:
    config.train.batch_size = 8
    config.train.num_steps = 3600
    config.train.log_every_steps = 200
    config.train.checkpoint_every_steps = 3600
  config.eval = avr.eval
  config.evals = ml_collections.ConfigDict()
  config.evals.test = ml_collections.ConfigDict(dict(
      type="classification", every_steps=0, split="test", logits_fn="logits"))
  if tiny:
    config.train.num_steps = 4
    config.train.log_every_steps = 2
    config.train.checkpoint_every_steps = 2
    config.optimizer.warmup_steps = 1
  return config
