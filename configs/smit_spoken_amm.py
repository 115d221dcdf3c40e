r"""S-MiT spoken-caption model (Monfort et al. 2021, sec. 4.2.2 and app. B), AMM loss.

The language config's video model, data, phases, optimisation and evaluation
(configs/smit_language_amm.py), with the caption side replaced: the 40-bin log-mel of
the spoken caption (a random 10 s crop in training, the whole caption at test) through
a speech encoder trained from scratch in both phases, then the projection head.

    # the synthetic S-MiT: the demo's RGB tower (make demo's stage 1), then the
    # features of 20k train clips (~7 min), phase 1 (~7 min at width 8), phase 2
    python -m avtext.features smit --config=configs/smit_spoken_amm.py:demo \
        --config.init_from.workdir=workdirs/demo/video_pretrain \
        --out=workdirs/demo/smit_spoken_features
    python -m avtext.main --config=configs/smit_spoken_amm.py:demo \
        --workdir=workdirs/demo/smit_spoken_p1 \
        --config.init_from.workdir=workdirs/demo/video_pretrain
    python -m avtext.main --config=configs/smit_spoken_amm.py:demo,phase2 \
        --workdir=workdirs/demo/smit_spoken_p2 \
        --config.init_from.workdir=workdirs/demo/smit_spoken_p1

Speech encoder (config.model.speech, table 3): ResNet-50 (the paper's best) with a
1-channel first convolution, BatchNorm statistics carried as `batch_stats` (and into
phase 2 by init_from); --config.model.speech.depth=34 for ResNet-34, or
--config.model.speech.name=resdavenet for ResDAVEnet.

demo: the language demo's world and tower, the captions spoken by the world's tone
renderer (a fixed sound per word; --config.features_source.speech=espeak for real speech
by espeak-ng, `avworld/tts.py`), with what the speech encoder, trained from
scratch, needs on a 2-core CPU (BENCHMARKS.md "S-MiT tables 2, 3 and 7"): 20k training clips (on the
language demo's 3000 it stays at chance: it memorizes the utterances), a ResNet-34 of
base width 8 (1/64 of the FLOPs of width 64; ResDAVEnet's widths / 8 with
`name=resdavenet`), batch 256, 3 epochs (234 steps; the paper's 100:
--config.train.num_epochs=100, ~4 h here). `make demo-smit` runs ResDAVEnet on real speech
(espeak-ng) over the language demo's features of 5000 clips, 6 epochs (BENCHMARKS.md
"S-MiT": beside the same run on tone speech).

Variants: as configs/smit_language_amm.py (demo, phase2, tiny).
"""

import ml_collections

from configs import smit_language_amm


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variants = set(filter(None, (arg or "").split(",")))
  config = smit_language_amm.get_config(arg, caption="spoken")
  config.model.speech = ml_collections.ConfigDict(dict(
      name="resnet", depth=50, width=64, in_channels=1,
      # name="resdavenet" reads these instead (the published ResDAVEnet's sizes):
      widths=(128, 128, 256, 512, 1024), blocks=(2, 2, 2, 2), kernel=9))
  if "demo" in variants:
    config.model.speech.depth, config.model.speech.width = 34, 8
    config.model.speech.widths = (16, 16, 32, 64, 128)  # ResDAVEnet at 1/8 width
    config.features_source.num_train = 20_000
    if "phase2" not in variants:
      config.dataset.path = "workdirs/demo/smit_spoken_features"
      config.train.batch_size = 256
      config.train.num_epochs = 3
  if "tiny" in variants:
    config.model.speech = ml_collections.ConfigDict(dict(
        name="resnet", depth=18, width=4, in_channels=1, stage_sizes=(1, 1)))
  return config
