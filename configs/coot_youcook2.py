r"""COOT on YouCook2 with HowTo100M (S3D) clip features (Ging et al. 2020, Table 2).

    python -m avtext.main --config=configs/coot_youcook2.py \
        --config.dataset.path=/data/coot/youcook2 --workdir=workdirs/coot_yc2

Defaults are the official `config/retrieval/paper2020/yc2_100m_coot.yaml`
(coot-videotext); everything not set here is `coot_activitynet.base_config()`.

Data (`config.dataset`, layout in avtext/data/coot_files.py):
  <path>/meta_all.json
  <path>/video_feat_100m.h5                  one [T, 512] dataset per video id
  <path>/text_feat_youcook2_meta_all_transformers_bert-base-uncased_-2,-1.h5
       (+ _sentence_splits.json)             build with avtext.features.coot_text

Variants: demo, tiny, masked_pool as in configs/coot_activitynet.py (the
synthetic data with this file's optimizer and selection rule; masked_pool: our
padding-invariant global mean instead of the official avg_special).
"""

import ml_collections

from configs import coot_activitynet


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variants = coot_activitynet.parse_variants(arg, "configs/coot_youcook2.py")
  config = coot_activitynet.base_config()
  d = config.dataset
  d.video_features = "video_feat_100m"  # vid_feat_name
  d.video_source = "h5"  # vid_feat_source
  d.video_dim = 512  # vid_feat_dim
  d.text_features = "text_feat_youcook2_meta_all_transformers_bert-base-uncased_-2,-1"
  d.add_stop_frame = 2  # add_stop_frame
  d.expand_segments = 0  # expand_segments
  config.model.video_dim = d.video_dim
  config.model.dropout = 0.05  # selfatn / crossatn / pooler dropout (YouCook2)
  config.model.max_clips = 32  # YouCook2 has at most 24 segments per video
  config.loss.cycle_weight = 0.001  # loss_cycle_cons

  o = config.optimizer
  o.name = "radam"
  o.learning_rate = 9e-4
  o.weight_decay = 0.0
  o.b1, o.b2, o.eps = 0.56, 0.98, 1.5e-9  # momentum, adam_beta2, adam_eps
  o.warmup_epochs = None  # warmup_epochs: 0
  o.warmup_steps = 0

  config.evals.val.split = "val"
  # det_best_field val_clip_sent_score_at_1: clip-sentence R@1 of both directions.
  config.eval.select = ("val/cs_R@1_mean", "max")
  config.eval.plateau.patience = 5  # rop_patience
  coot_activitynet.apply_variants(config, variants)
  return config
