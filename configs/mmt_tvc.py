r"""MMT on TVC (TVR app. D.2): video clip features + subtitles -> moment captions.

    python -m avtext.tools.caption_vocab --config=configs/mmt_tvc.py \
        --config.dataset.path=/data/tvc --out=/data/tvc/tvc_word2idx.json
    python -m avtext.main --config=configs/mmt_tvc.py --workdir=workdirs/mmt_tvc \
        --config.dataset.path=/data/tvc --config.model.vocab=/data/tvc/tvc_word2idx.json
    make demo-tvc     # the `demo` variant on the synthetic long videos

Data: the official TVCaption layout under `dataset.path` (avtext/data/builders/tvc.py):
tvc_{train,val,test_public}_release.jsonl, tvqa_preprocessed_subtitles.jsonl and
video_feature/tvr_resnet152_rgb_max_i3d_rgb600_avg_cat_cl-1.5.h5 (3072-d). Without
them training stops with what to prepare. The vocabulary is TVCaption's word2idx
(an official cache/tvc_word2idx.json loads as is; caption_vocab builds the same
rule: training-caption words seen more than 5 times).

Defaults are the official TVCaption ones (baselines/multimodal_transformer,
train.py + scripts/train.sh video_sub resnet_i3d): hidden 768, 2 encoder and 2
decoder layers, 12 heads, intermediate 768, 300-d word embeddings trained from
scratch (no GloVe), dropout 0.1; max_v_len 20, max_sub_len 30, max_cap_len 20;
label smoothing 0.1; lr 1e-4, 10 % linear warmup then linear decay over 50
epochs, weight decay 0.01 except biases and LayerNorm, eps 1e-6, global grad
clip 1; batch 128; greedy decoding with [UNK] banned; validation CIDEr-D after
every epoch selects the best checkpoint, training stops after 10 evaluations
without gain (the official es_cnt > 10); at the end test_public (released without
descriptions) is captioned into a submission file, workdir/captions/test_public_step<N>.jsonl.
The model and loss are the official functions: the official decoder layer (no
output Linear after its attentions, a single Linear as its feed-forward part;
avtext/models/mmt.py) and the official label-smoothed KL summed over the batch's
words (avtext/losses/captioning.py, "kl_sum"); official checkpoints import with
`python -m avtext.import_checkpoint --system=mmt` (avtext/weights/official_mmt.py).
Remaining difference from the official code: optax AdamW (bias-corrected) in place
of BertAdam.

Variants:
  standard_decoder  our decoder layer: the paper's "standard design" (output Linear
               after each attention, GELU MLP of width intermediate_size), the layer
               every avtext transformer shares (reason: avtext/models/mmt.py)
  mean_nll     our loss: cross-entropy to the uniformly smoothed target (eps/V),
               averaged over the batch's words (reason: avtext/losses/captioning.py)
  video, sub   the paper's Table 14 ablation (context without subtitles / video)
  demo         the synthetic long videos (avworld/tools/tvr_synthetic.py writes them in
               this layout to workdirs/demo/tvr_data): clip features of the demo's
               pretrained video tower; a 256-wide MMT sized for this CPU
  tiny         seconds-long smoke run (tests)
"""

import ml_collections

from avtext.data.builders import tvc
from configs import common

DEMO_DATA = "workdirs/demo/tvr_data"


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variants = common.parse_variants(
      arg, ("demo", "tiny", "video", "sub", "standard_decoder", "mean_nll"), "configs/mmt_tvc.py")
  config = ml_collections.ConfigDict()
  config.task = "captioning"
  config.seed = 2019  # train.py
  config.num_devices = None

  config.dataset = ml_collections.ConfigDict(dict(
      name="tvc", path=ml_collections.config_dict.placeholder(str),
      video_features=tvc.DEFAULT_VIDEO_FEATURES, video_dim=3072,
      subtitles="tvqa_preprocessed_subtitles.jsonl", clip_length=tvc.CLIP_LENGTH, max_moments=-1))

  config.data = ml_collections.ConfigDict(dict(
      context="video_sub", max_v_len=20, max_sub_len=30, max_cap_len=20))

  config.model = ml_collections.ConfigDict(dict(
      name="mmt", vocab=ml_collections.config_dict.placeholder(str),
      vocab_size=ml_collections.config_dict.placeholder(int), video_dim=3072,
      hidden_size=768, num_layers=2, num_heads=12, intermediate_size=768, word_dim=300,
      max_positions=50, dropout_rate=0.1, attention_dropout_rate=0.1, layer_norm_eps=1e-12,
      decoder_layer="official"))  # "standard": the :standard_decoder variant

  # "kl_sum": the official LabelSmoothingLoss summed over the words; "nll": :mean_nll.
  config.loss = ml_collections.ConfigDict(dict(name="kl_sum", label_smoothing=0.1))
  config.generation = ml_collections.ConfigDict(dict(
      beam_size=1, max_new_tokens=19, min_length=0, length_penalty=0.0, banned_ids=(6,)))

  config.optimizer = ml_collections.ConfigDict(dict(
      name="adamw", learning_rate=1e-4, weight_decay=0.01,
      weight_decay_exclude=(r"bias$", r"norm"), b1=0.9, b2=0.999, eps=1e-6,
      schedule="linear", warmup_epochs=5.0, warmup_steps=0, grad_clip_norm=1.0, frozen=(),
      lr_multipliers=()))  # warmup 0.1 x 50 epochs

  config.init_from = ml_collections.ConfigDict(dict(
      workdir=ml_collections.config_dict.placeholder(str),
      step=ml_collections.config_dict.placeholder(str), params=(("", ""),)))

  config.train = ml_collections.ConfigDict(dict(
      batch_size=128, num_epochs=50, log_every_steps=100,
      checkpoint_every_steps=1000, keep_checkpoints=2, async_checkpointing=True))
  # None: the epochs count; --config.train.num_steps=N shortens the run (docs/scale.md)
  config.train.num_steps = ml_collections.config_dict.placeholder(int)

  config.evals = ml_collections.ConfigDict()
  config.evals.val = ml_collections.ConfigDict(dict(
      type="captioning", every_epochs=1, split="val", captions_fn="captions",
      output_format="tvc", batch_size=50))
  # The released test_public has no descriptions: captioned at the end (and in --mode=eval)
  # into workdir/captions/test_public_step<N>.jsonl, TVCaption's submission format.
  config.evals.test_public = ml_collections.ConfigDict(dict(
      type="captioning", every_steps=0, split="test_public", captions_fn="captions",
      output_format="tvc", batch_size=50))
  config.eval = common.eval_config(batch_size=50)
  config.eval.select = ("val/CIDEr-D", "max")
  config.eval.early_stopping_patience = 10

  if "video" in variants:
    config.data.context = "video"
  if "sub" in variants:
    config.data.context = "sub"
  if "standard_decoder" in variants:
    config.model.decoder_layer = "standard"
  if "mean_nll" in variants:
    config.loss.name = "nll"
  # MMT: features in, batch 128: one v5e host (4 chips) holds it many times over, bf16
  # compute and float32 params (BENCHMARKS.md "Paper configs on their TPU slices").
  common.paper_scale(config, "v5e:2x2")
  return common.with_synthetic(config, variants, _synthetic)


def _synthetic(config: ml_collections.ConfigDict, tiny: bool) -> None:
  config.dataset.path = DEMO_DATA
  config.dataset.video_features = f"synthetic_tower_cl-{tvc.CLIP_LENGTH}"
  config.dataset.video_dim = config.model.video_dim = 128  # the RGB tower's width
  m = config.model
  # CPU budget: a quarter of the width (the synthetic captions use ~200 words).
  m.hidden_size, m.num_heads, m.intermediate_size = 256, 4, 256
  config.optimizer.learning_rate = 5e-4
  config.optimizer.warmup_epochs = 1.0
  config.train.batch_size = 64
  config.train.num_epochs = 6  # 340 steps; keeps make demo-tvc < 15 min
  config.train.log_every_steps = 50
  config.train.checkpoint_every_steps = 500
  config.evals.val.every_epochs = 2
  config.evals.val.batch_size = config.eval.batch_size = 100
  del config.evals["test_public"]  # the synthetic test_public has references: scored below
  config.evals.test = ml_collections.ConfigDict(dict(
      type="captioning", every_steps=0, split="test_public", captions_fn="captions",
      output_format="tvc", batch_size=100, baselines=dict(most_frequent=dict(num_train=10**6))))
  if tiny:
    m.hidden_size, m.num_heads, m.intermediate_size, m.word_dim = 32, 2, 32, 16
    config.data.max_v_len, config.data.max_sub_len, config.data.max_cap_len = 8, 12, 10
    config.generation.max_new_tokens = 9
    common.tiny_schedule(config, num_steps=6, every_steps=3, warmup_steps=2)
    config.evals.val.batch_size = config.evals.test.batch_size = 8
    # Off, yet overridable from the flags (a None field takes no --config value).
    config.eval.early_stopping_patience = ml_collections.config_dict.placeholder(int)
