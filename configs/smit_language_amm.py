r"""S-MiT language-caption model (Monfort et al. 2021, sec. 4 and app. B), AMM loss.

Two phases, two runs chained by init_from (app. B):

  phase 1 (default)  visual backbones and language model frozen; only the two projection
                     heads train; Adam, fixed lr 1e-3; it reads the frozen parts'
                     outputs precomputed once (`smit_features`, written by
                     `python -m avtext.features smit`), which is the same model.
  phase2             the visual backbones train too (from frames); Adam, fixed lr 1e-5;
                     the language model stays frozen; starts from phase 1's best
                     checkpoint on the validation split (init_from.step="best").

    # the paper's setup on real S-MiT (says what to prepare until the files exist);
    # S-MiT as DIR/{train,val,test}.csv + the files (avtext/data/builders/smit.py)
    python -m avtext.features smit --config=configs/smit_language_amm.py \
        --config.features_source.path=DIR --out=<smit_features dir>   # or your own
    python -m avtext.main --config=configs/smit_language_amm.py --workdir=workdirs/smit_p1 \
        --config.dataset.path=<smit_features dir>
    python -m avtext.main --config=configs/smit_language_amm.py:phase2 \
        --workdir=workdirs/smit_p2 --config.init_from.workdir=workdirs/smit_p1 \
        --config.dataset.path=DIR
    # the synthetic S-MiT, end to end: make demo-smit (see the Makefile for the steps)

Variants (after the colon, comma-separated):
  (none)   the paper's phase 1: ResNet-152 (3 frames, 1 fps) + a temporal ResNet-50 (8
           frames, ~3 fps; S-MiT uses TSM-R50, which avtext does not have: real users
           bring their TSM features in the smit_features layout), BERT-base over the
           ASR transcript (config.model.text.weights: a local HF BERT directory), 4096-d
           GLU heads, batch 2048, 100 epochs, best on val after each epoch.
  demo     the synthetic S-MiT (`synthetic_smit`: 3 s clips, 15 % WER transcripts): both
           backbones are the demo's pretrained RGB tower (configs/synthetic_video_pretrain.py,
           standing in for the ImageNet ResNet and the M-MiT TSM: the only pretrained
           vision model the synthetic world has). The image backbone sees each of 3
           frames at 1 fps as a still 4-frame clip (as an inflated 3D net sees an image);
           the temporal one sees 8 frames every 8 (3.1 fps) as two 4-frame windows (the
           tower's length), max-pooled. MiniLM-L6 over the transcript, 1024-d heads.
  phase2   phase 2 (see above); with demo: 64-clip batches from frames, 10 steps and
           the test split only (a CPU shows the chain, not a converged phase 2; not a
           stage of make demo-smit, whose 15 minutes hold the spoken and ASR-text models).
  asr      with demo: the ASR-text model's test: the same world with the captions spoken
           by espeak-ng (features_source.speech='espeak') and transcribed by pocketsphinx
           (avworld.tools.smit_asr -> features_source.asr_transcripts), features of the
           test split only (workdirs/demo/smit_asr_features), evaluated by phase 1's
           checkpoint (`--mode=eval --step=best --eval_dir=...`; make demo-smit, which
           transcribes the first 1000 test clips).
  tiny     seconds-long smoke run (tests).

Loss: --config.loss.name=amm|mms|nce|semi_hard_triplet (avtext/tasks/smit.py).
"""

import ml_collections

from configs import common
from configs import videocc_avr

FROZEN_ALWAYS = (r"^caption/text/",)  # the language model (app. B: kept frozen)
FROZEN_PHASE1 = (r"^video/image/", r"^video/temporal/")


def get_config(arg: str | None = None, caption: str = "language") -> ml_collections.ConfigDict:
  variants = common.parse_variants(arg, ("demo", "tiny", "phase2", "asr"),
                                        f"configs/smit_{caption}_amm.py")
  phase2 = "phase2" in variants

  config = ml_collections.ConfigDict()
  config.task = "smit"
  config.seed = 0
  config.num_devices = None

  # ---- data ------------------------------------------------------------------
  config.dataset = ml_collections.ConfigDict()
  # The real S-MiT clips: DIR/{train,val,test}.csv of video_id, video, spoken_caption,
  # transcript (avtext/data/builders/smit.py); spoken=False opens no caption audio.
  def real():  # a path of its own each time (a placeholder: --config.<...>.path=DIR sets it)
    return dict(name="smit", path=ml_collections.config_dict.placeholder(str),
                spoken=caption == "spoken")
  if phase2:
    config.dataset = ml_collections.ConfigDict(real())  # the clips (frames for the backbones)
  else:
    config.dataset.name = "smit_features"  # avtext/data/builders/smit.py
    config.dataset.path = ml_collections.config_dict.placeholder(str)
  # The clips phase 1's features are computed from (avtext.features.smit).
  config.features_source = ml_collections.ConfigDict(real())

  config.data = ml_collections.ConfigDict()
  config.data.fps = 25
  config.data.num_image_frames = 3  # sec. 4.1: 3 frames at 1 fps
  config.data.image_fps = 1.0
  config.data.num_temporal_frames = 8  # sec. 4.1: 8 frames, ~3 fps
  config.data.temporal_stride = 8  # 25 / 8 = 3.1 fps
  config.data.image_size = 224
  config.data.max_text_len = 64  # WordPieces of a transcript (S-MiT: ~18 words on average)
  config.data.vocab = None  # None: the text encoder's vocab.txt
  config.data.num_mel_bins = 40  # sec. 4.2.2: 40-d log-mel
  config.data.speech_crop_s = 10.0  # sec. 4.2.2: a random 10 s crop in training
  config.data.speech_frames = 1000  # 10 s at 100 frames/s; longer captions are cut at test

  # ---- model -----------------------------------------------------------------
  config.model = ml_collections.ConfigDict()
  config.model.name = "smit"
  config.model.caption = caption
  config.model.embed_dim = 4096  # sec. 4: 4096-d; table 8
  config.model.normalize = True  # heads.GatedEmbedding: dot products of unit vectors
  config.model.max_words = 48
  config.model.num_sampled_words = 10  # sec. 4.2.1
  v = config.model.video = ml_collections.ConfigDict()
  v.image = ml_collections.ConfigDict(dict(name="resnet", depth=152))
  v.temporal = ml_collections.ConfigDict(dict(name="resnet", depth=50))
  v.image_mode, v.temporal_mode = "frames", "frames"
  v.still_frames, v.window = 2, None
  v.train_backbones = phase2
  if caption == "language":
    t = config.model.text = ml_collections.ConfigDict()
    t.name = "bert"
    t.weights = None  # a local HF BERT-base directory (config.json + safetensors + vocab.txt)
    t.vocab_size, t.hidden_size, t.num_layers, t.num_heads = 30522, 768, 12, 12
    t.intermediate_size, t.max_position_embeddings, t.dropout_rate = 3072, 512, 0.0

  # ---- loss (sec. 4.3) ---------------------------------------------------------
  config.loss = ml_collections.ConfigDict()
  config.loss.name = "amm"
  config.loss.alpha = 0.5
  config.loss.temperature = 1.0
  config.loss.margin = 1.0  # semi_hard_triplet
  config.loss.margin_initial, config.loss.margin_growth = 0.001, 1.002  # mms
  config.loss.margin_every = 1000

  # ---- optimisation (app. B) ---------------------------------------------------
  config.optimizer = ml_collections.ConfigDict()
  config.optimizer.name = "adam"
  config.optimizer.learning_rate = 1e-5 if phase2 else 1e-3
  config.optimizer.schedule = "constant"
  config.optimizer.warmup_epochs = None
  config.optimizer.warmup_steps = 0
  config.optimizer.grad_clip_norm = None
  frozen = FROZEN_ALWAYS if caption == "language" else ()
  config.optimizer.frozen = frozen if phase2 else frozen + FROZEN_PHASE1
  config.optimizer.lr_multipliers = ()

  config.init_from = ml_collections.ConfigDict()
  config.init_from.workdir = ml_collections.config_dict.placeholder(str)
  config.init_from.step = "best" if phase2 else ml_collections.config_dict.placeholder(str)
  # phase 2: everything from phase 1's best; phase 1: pretrained backbones (set below
  # for the demo; the paper's come from torchvision / TSM weights the user converts).
  config.init_from.params = (("", ""),)

  config.train = ml_collections.ConfigDict()
  config.train.batch_size = 2048  # app. B; negatives = the global batch
  config.train.num_epochs = 100  # app. B
  config.train.num_steps = ml_collections.config_dict.placeholder(int)
  config.train.log_every_steps = 50
  config.train.checkpoint_every_steps = 1000
  config.train.keep_checkpoints = 2
  config.train.async_checkpointing = True

  # ---- evaluation: best on val after each epoch; test = five 1k subsets --------
  config.evals = ml_collections.ConfigDict()
  config.evals.val = ml_collections.ConfigDict(dict(
      type="retrieval", every_epochs=1, split="val", text_fn="embed_text",
      video_fn="embed_video"))
  config.evals.test = ml_collections.ConfigDict(dict(
      type="retrieval", every_steps=0, split="test", text_fn="embed_text",
      video_fn="embed_video",
      subset_protocol=dict(n_subsets=5, subset_size=1000, seed=0)))
  config.eval = common.eval_config(batch_size=256)
  config.eval.select = ("val/mean_R@1", "max")

  # Phase 1 trains the heads on precomputed backbone features (batch 2048, AMM over the
  # whole batch): one v5e host holds it (BENCHMARKS.md "Paper configs on their TPU
  # slices"). Phase 2 runs ResNet-152 + ResNet-50 on 2048 clips' frames with their
  # backward pass, each block rematerialized, FSDP: 24.7 GiB of temporaries a chip on
  # 16 chips, 15.96 GiB a chip on v5e:4x8 (just over its 15.75), 8.5 GiB on v5e:8x8.
  # The spoken model's phase 1 also trains its speech ResNet on 2048 log-mels: remat
  # (without it 14.7 GiB of v5e's 15.75 a chip).
  if phase2:
    common.paper_scale(config, "v5e:8x8", remat="full", fsdp=True)
  else:
    common.paper_scale(config, "v5e:2x2",
                            remat="full" if caption == "spoken" else "none")
  if "demo" in variants or "tiny" in variants:
    _synthetic(config, tiny="tiny" in variants, phase2=phase2)
  if "asr" in variants:
    if "demo" not in variants or phase2:
      raise ValueError(f"configs/smit_{caption}_amm.py: the asr variant goes with demo "
                       f"(phase 1), as demo,asr")
    config.features_source.speech = "espeak"
    config.features_source.asr_transcripts = "workdirs/demo/smit_asr"
    config.dataset.path = "workdirs/demo/smit_asr_features"
    del config.evals["val"]  # the engine transcribes the test split (the demo's budget)
    config.eval.select = None
  return config


def _synthetic(config, *, tiny: bool, phase2: bool) -> None:
  common.synthetic_scale(config)
  tower = videocc_avr.get_config("tiny" if tiny else "demo")
  world = dict(tower.dataset.world)
  world["duration_s"] = 3.0  # S-MiT clips are 3 s
  config.dataset = ml_collections.ConfigDict()
  clips = ml_collections.ConfigDict(dict(
      name="synthetic_smit", world=world, world_seed=0, asr_wer=0.15,
      asr_substitution_share=0.7, num_train=3000, num_val=500, num_eval=2000,
      speech="tones",  # or "espeak": real speech (avworld/tts.py)
      asr_transcripts=ml_collections.config_dict.placeholder(str)))
  if phase2:
    config.dataset = clips
  else:
    config.dataset.name = "smit_features"
    config.dataset.path = "workdirs/demo/smit_features"
  # What the features were (or are to be) computed from: the tool reads it.
  config.features_source = clips

  d = config.data
  d.image_size = tower.data.image_size
  d.max_text_len = 40
  d.speech_frames = 800  # the synthetic captions are at most ~8 s

  m = config.model
  m.embed_dim = 1024
  m.max_words = 32
  rgb = ml_collections.ConfigDict(tower.model.video.to_dict())
  rgb.modalities = "rgb"
  m.video.image = rgb
  m.video.temporal = ml_collections.ConfigDict(rgb.to_dict())
  m.video.image_mode, m.video.temporal_mode = "still", "clip"
  m.video.still_frames = tower.data.num_frames  # the position embeddings are for 4 frames
  m.video.window = tower.data.num_frames
  if "text" in m:
    t = m.text
    for key in ("weights", "vocab_size", "hidden_size", "num_layers", "num_heads",
                "intermediate_size", "max_position_embeddings"):
      t[key] = tower.model.text[key]
    t.dropout_rate = 0.0

  config.train.batch_size = 64 if phase2 else 1024
  none = ml_collections.config_dict.placeholder(int)  # None, overridable from the flags
  config.train.num_epochs = none if phase2 else 100  # 100 epochs of 3000 clips: 200 steps
  config.train.num_steps = 10 if phase2 else none
  config.train.log_every_steps = 20
  config.train.checkpoint_every_steps = 100
  if phase2:  # from frames, on a CPU: the test split at the end only
    del config.evals["val"]
    config.eval.select = None
  config.eval.batch_size = 250
  if not phase2:
    # The tower's RGB MBT becomes both backbones (the module docstring).
    config.init_from.params = (("video/", "video/image/"), ("video/", "video/temporal/"))

  if tiny:
    clips.num_train, clips.num_val, clips.num_eval = 64, 20, 20
    config.features_source = clips
    if phase2:
      config.dataset = clips
    d.max_text_len, d.speech_frames = 24, 300
    m.embed_dim, m.max_words = 16, 16
    config.train.batch_size = 8
    config.train.num_epochs, config.train.num_steps = None, 4
    config.train.log_every_steps = 2
    config.train.checkpoint_every_steps = 2
    if "val" in config.evals:
      config.evals.val.every_epochs = None
      config.evals.val.every_steps = 2
    config.evals.test.subset_protocol = dict(n_subsets=2, subset_size=10, seed=0)
    config.eval.batch_size = 8  # divisible by the tests' 8 fake devices
