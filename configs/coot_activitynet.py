r"""COOT on ActivityNet-captions (Ging et al. 2020, Tables 2 and 7), and its demo.

    python -m avtext.main --config=configs/coot_activitynet.py \
        --config.dataset.path=/data/coot/activitynet --workdir=workdirs/coot_anet
    make demo-coot    # the `demo` variant on the synthetic paragraph videos

Every default is the official `config/retrieval/paper2020/anet_coot.yaml` of
simon-ging/coot-videotext (cited field by field below); the paper gives the
same values in §4 and appendix A.

Data (`config.dataset`, the `coot` dataset, layout in avtext/data/coot_files.py):
  <path>/meta_all.json                           segments and captions per video
  <path>/features/ICEP_V3_global_pool_skip_8_direct_resize/v_<id>.npz
                                                 2048-d Inception-V3 frame features
  <path>/text_feat_activitynet_meta_all_transformers_bert-base-uncased_-2,-1.h5
       (+ _sentence_splits.json)                 BERT last two layers per token, 1536-d
The official setup (README of coot-videotext) downloads the first two; the text
features can be built with
    python -m avtext.features coot_text --dataset_dir=<path> \
        --bert_dir=<HF bert-base-uncased dir>
Without them training stops with what to prepare.

Variants:
  demo     the synthetic paragraph videos (avworld/tools/coot_synthetic.py writes them in
           this layout to workdirs/demo/coot_data): per-frame features of the demo's
           pretrained video tower, MiniLM-L6's last two layers for the text
  tiny     seconds-long smoke run on a small synthetic dataset (tests)
  masked_pool  our masked global mean instead of the official `avg_special`
           (composes with demo / tiny: `:demo,masked_pool`). The official pooler sums
           the global transformer's outputs at the padded clip slots too (up to the
           batch's longest video) and divides by the real count, so an embedding
           depends on the other videos of its batch; the masked mean averages the
           real clips only (avtext/models/coot.py). Default: official, so imported
           official checkpoints (avtext.import_checkpoint) compute their function.
Ablations (BENCHMARKS.md, benchmarks/tables/coot_ablation.py) are command-line overrides:
  --config.model.local_pooler=max|avg   Attention-FA off
  --config.loss.cycle_weight=0           CMC off
  --config.model.use_context=False       Contextual Transformer off
"""

import ml_collections

from configs import common

ANET_VIDEO_FEATURES = "ICEP_V3_global_pool_skip_8_direct_resize"
ANET_TEXT_FEATURES = "text_feat_activitynet_meta_all_transformers_bert-base-uncased_-2,-1"
DEMO_DATA = "workdirs/demo/coot_data"


def base_config() -> ml_collections.ConfigDict:
  """Everything ActivityNet and YouCook2 share (official values)."""
  config = ml_collections.ConfigDict()
  config.task = "coot"
  config.seed = 0
  config.num_devices = None

  config.dataset = ml_collections.ConfigDict()
  config.dataset.name = "coot"
  config.dataset.path = ml_collections.config_dict.placeholder(str)  # the dataset dir
  config.dataset.metadata_name = "all"  # meta_all.json
  config.dataset.video_features = ""
  config.dataset.video_source = "h5"
  config.dataset.video_dim = 0
  config.dataset.text_features = ""
  config.dataset.text_dim = 1536  # bert-base-uncased, layers -2 and -1 concatenated
  config.dataset.add_stop_frame = 1
  config.dataset.expand_segments = 0
  config.dataset.max_datapoints = -1

  config.data = ml_collections.ConfigDict()
  config.data.max_frames = 80  # dataset_train.max_frames: frames per clip and per video
  config.data.pad_multiple = 8  # padded frame / token axes are multiples of this
  # Every batch at its maximum shape, so a TPU run compiles one program (avtext/tasks/coot.py);
  # the synthetic variants pad to each batch's longest instead.
  config.data.static_shapes = True
  # Every sentence padded to this many tokens under static_shapes (a longer one stops the
  # run naming this field); the paragraph's cap is coot_text's 512.
  config.data.max_sentence_tokens = 96
  config.data.clip_pad_multiple = 32  # the packed clip axis of a batch
  config.data.max_clips_per_batch = None  # fixed clip axis (multi-process runs need it)
  # Sequence packing (avtext/tasks/coot.py, `array_store.pack`): clips, sentences, videos and
  # paragraphs several to a padded row, attention within each, positions restarting per
  # sequence, pooled per sequence. The same function as the padded layout (tests/
  # test_tasks_coot.py: embeddings, loss, gradients), but only dropout masks differ;
  # the local transformers stop computing padding (BENCHMARKS.md, COOT train step).
  config.data.pack_sequences = True

  config.model = ml_collections.ConfigDict()
  config.model.name = "coot"
  config.model.video_dim = 0  # set from the dataset below
  config.model.text_dim = 1536
  config.model.hidden_size = 384  # input_fc_config.output_dim, selfatn hidden_dim
  config.model.num_heads = 8  # selfatn_config.num_heads
  config.model.mlp_dim = 384  # selfatn_config.pointwise_ff_dim
  config.model.num_layers = 1  # selfatn_config.num_layers
  config.model.dropout = 0.025  # selfatn / crossatn / pooler dropout (ActivityNet)
  config.model.local_pooler = "atn"  # pooler_config.name: Attention-FA (eq. 4)
  config.model.pool_hidden = 768  # pooler_config.hidden_dim
  config.model.pool_heads = 2  # pooler_config.num_heads
  config.model.use_context = True  # net_*_global.use_context: Contextual Transformer (eq. 5)
  # net_*_global.pooler_config avg_special: sums the padded clip slots too (official);
  # True (variant masked_pool): our masked mean, padding-invariant (avtext/models/coot.py).
  config.model.masked_pool = False
  config.model.init_std = 0.01  # weight_init_type truncnorm, weight_init_std
  # Dropout keep-masks from a counter hash (`avtext.ops.hash_bernoulli`): threefry masks
  # were ~25% of a CPU train step (BENCHMARKS.md); "jax" restores flax's own masks.
  config.model.dropout_masks = "hash"
  config.model.max_clips = 32  # clip slots per video (ActivityNet's longest has 27)
  config.model.max_positions = 1000  # sin-cos table (official max_len)

  config.loss = ml_collections.ConfigDict()
  config.loss.margin = 0.2  # contrastive_loss_config.margin (alpha = beta = gamma = ... = 0.2)
  config.loss.weight_high = 1.0  # video-paragraph alignment
  config.loss.weight_low = 1.0  # clip-sentence alignment
  config.loss.weight_context = 1.0  # global-context alignment
  config.loss.weight_high_cluster = 1.0  # weight_high_internal
  config.loss.weight_low_cluster = 1.0  # weight_low_internal
  config.loss.weight_context_cluster = 0.0  # weight_context_internal
  # The official trainer multiplies the context-cluster term by weight_low_internal
  # whenever weight_context_internal != 0; True reproduces it (avtext/tasks/coot.py).
  config.loss.official_context_cluster_weight = True
  config.loss.cycle_weight = 0.01  # loss_cycle_cons (lambda of eq. 9), ActivityNet
  config.loss.cycle_samples = 1  # one clip / sentence per video (CycleConsistencyLoss default)

  config.optimizer = ml_collections.ConfigDict()
  config.optimizer.name = "adam"
  config.optimizer.learning_rate = 1e-3
  config.optimizer.weight_decay = 2e-5  # torch Adam's coupled L2 (weight_decay_for_bias: true)
  config.optimizer.b1 = 0.9
  config.optimizer.b2 = 0.999
  config.optimizer.eps = 1e-8
  config.optimizer.schedule = "constant"  # reduce_opw: warmup, then reduce-on-plateau
  config.optimizer.warmup_epochs = 3  # lr_scheduler.warmup_epochs (linear)
  config.optimizer.warmup_steps = None
  config.optimizer.grad_clip_norm = None  # clip_gradient: -1
  config.optimizer.frozen = ()
  config.optimizer.lr_multipliers = ()

  config.init_from = ml_collections.ConfigDict()
  config.init_from.workdir = ml_collections.config_dict.placeholder(str)
  config.init_from.step = ml_collections.config_dict.placeholder(str)
  config.init_from.params = (("", ""),)

  config.train = ml_collections.ConfigDict()
  config.train.batch_size = 64  # train.batch_size
  config.train.num_epochs = 100  # train.num_epochs
  # None: the epochs count; --config.train.num_steps=N shortens the run (docs/scale.md)
  config.train.num_steps = ml_collections.config_dict.placeholder(int)
  config.train.log_every_steps = 10
  config.train.checkpoint_every_steps = 1000
  config.train.keep_checkpoints = 1
  config.train.async_checkpointing = True

  config.evals = ml_collections.ConfigDict()
  config.evals.val = ml_collections.ConfigDict(dict(
      type="hierarchical", every_epochs=1, split="val_1", embed_fn="embed",
      ks=(1, 5, 10, 50), median_convention="coot", export_embeddings=True))
  config.eval = ml_collections.ConfigDict(dict(
      batch_size=64,  # val.batch_size
      # det_best_field val_score_at_1: video-paragraph R@1 of both directions.
      select=("val/vp_R@1_mean", "max"),
      keep_best=1,
      # rop_factor 0.1, rop_patience 2, rop_cooldown 3, rop_min_lr_factor 0;
      # threshold 1e-4 relative (det_best_threshold_*).
      plateau=dict(factor=0.1, patience=2, cooldown=3, min_lr=0.0, threshold=1e-4),
      early_stopping_patience=16))  # det_best_terminate_after
  # Features in, a few small transformers: one v5e host (4 chips) holds it many times
  # over (BENCHMARKS.md "Paper configs on their TPU slices"); bf16 compute, params float32.
  common.paper_scale(config, "v5e:2x2")
  return config


VARIANTS = ("demo", "tiny", "masked_pool")


def parse_variants(arg: str | None, config_file: str) -> set[str]:
  """The comma-separated variants of `arg`, checked against VARIANTS (shared by
  configs/coot_youcook2.py)."""
  return common.parse_variants(arg, VARIANTS, config_file)


def apply_variants(config: ml_collections.ConfigDict, variants: set[str]) -> None:
  """demo / tiny: the synthetic data; masked_pool: our padding-invariant global mean."""
  if "masked_pool" in variants:
    config.model.masked_pool = True
  if variants & {"demo", "tiny"}:
    synthetic(config, tiny="tiny" in variants)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variants = parse_variants(arg, "configs/coot_activitynet.py")
  config = base_config()
  d = config.dataset
  d.video_features = ANET_VIDEO_FEATURES  # dataset_train.vid_feat_name
  d.video_source = "npz_activitynet"  # vid_feat_source
  d.video_dim = 2048  # vid_feat_dim
  d.text_features = ANET_TEXT_FEATURES  # text_feat_name
  d.add_stop_frame = 1  # add_stop_frame
  d.expand_segments = 10  # expand_segments: clips of at least 10 frames
  config.model.video_dim = d.video_dim
  apply_variants(config, variants)
  return config


def synthetic(config: ml_collections.ConfigDict, *, tiny: bool) -> None:
  """The synthetic paragraph videos: same model and loss, smaller schedule."""
  common.synthetic_scale(config)
  config.data.static_shapes = False
  d = config.dataset
  d.path = DEMO_DATA
  d.video_features = "synthetic_tower"  # avworld/coot_layout.py's names
  d.video_source = "h5"
  d.video_dim = 128  # the demo video tower's width (configs/videocc_avr.py:demo)
  d.text_features = "text_feat_synthetic_meta_all_transformers_minilm-l6_-2,-1"
  d.text_dim = 768  # MiniLM-L6: 2 x 384
  d.add_stop_frame = 1
  d.expand_segments = 2  # 1 feature/s (make demo-coot): at least 2 s
  config.model.video_dim, config.model.text_dim = d.video_dim, d.text_dim
  config.model.max_clips = 8  # 3-8 scenes per video
  # Coarse padding: every distinct batch shape compiles the step once (seconds on a CPU).
  config.data.pad_multiple = 16
  config.data.clip_pad_multiple = 64
  # A narrower COOT than the official 384 (a 64-video step of the full width
  # takes ~6 s on the 2-core CPU): 128-d T-Transformers, 4 heads, AF hidden 256.
  m = config.model
  m.hidden_size, m.num_heads, m.mlp_dim, m.pool_hidden = 128, 4, 128, 256
  config.evals.val.split = "val"
  config.train.num_epochs = 10  # the ablation's budget (BENCHMARKS.md); keeps make demo-coot < 15 min
  config.train.log_every_steps = 20
  config.optimizer.warmup_epochs = 1
  config.eval.early_stopping_patience = 8
  if tiny:
    d.path = None  # the test writes a small dataset and sets it
    d.video_dim = 16
    d.text_dim = 24
    config.model.video_dim, config.model.text_dim = 16, 24
    config.model.hidden_size, config.model.num_heads, config.model.mlp_dim = 32, 4, 32
    config.model.pool_hidden, config.model.pool_heads = 32, 2
    common.tiny_schedule(config, num_steps=6, every_steps=3, warmup_steps=1)
