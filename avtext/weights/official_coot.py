r"""Official COOT checkpoints (gingsi/coot-videotext) -> the avtext `coot` model.

    python -m avtext.import_checkpoint --system=coot \
        --checkpoint=<exp>/models/model_<epoch>.pth --out=RUNDIR \
        [--config=configs/coot_youcook2.py]

The checkpoint: `nntrainer/trainer_base.py` `_save_checkpoint` writes
`th.save(model_mgr.get_model_state(), models_file)`, and `get_model_state`
(`nntrainer/models/model_manager_base.py`) is {network name: state_dict} of the
four `TransformerLegacy` networks of `coot/model_retrieval.py`
`RetrievalModelManager`: net_video_local, net_video_global, net_text_local,
net_text_global. `official.read_checkpoint` flattens it to
"<network>.<tensor>". The first coot-videotext release saved a list of the
four state dicts with older names; `configure` renames those as the official
loader does (`set_model_state`: input_norm. -> norm_input., input_fc. ->
input_fc.mlp., pooler.genpool -> pooler.pools.0.genpool).

Tensor mapping (N = a network, A = its avtext module video_local, video_global,
text_local, text_global; torch Linear weights [out, in] are transposed;
attention projections split into heads, `official.heads_in/heads_out`):

  N.norm_input.{gain,bias}                      A/norm_input/{scale,bias}
  N.input_fc.mlp.0.{weight,bias}                A/input_fc/{kernel,bias}       (local)
  N.embedding.pe                                (not stored: the sin-cos table, recomputed;
                                                 checked against `coot.sincos_table`)
  N.tf.encoder_layers.i.self_attention_layer.
    sublayer.{query,key,value}_projection.*     A/encoderblock_i/attention/{query,key,value}
    sublayer.final_projection.*                 A/encoderblock_i/attention/out
    layer_normalization.{gain,bias}             A/encoderblock_i/attention_norm/{scale,bias}
  N.tf.encoder_layers.i.pointwise_feedforward_layer.
    sublayer.feed_forward.0.*                   A/encoderblock_i/mlp/dense_in
    sublayer.feed_forward.3.*                   A/encoderblock_i/mlp/dense_out
    layer_normalization.{gain,bias}             A/encoderblock_i/mlp_norm/{scale,bias}
  N.tf_context.encoder_layers.0.<as above>      A/context/{cross_attention,cross_attention_norm,
                                                 mlp,mlp_norm}                 (global)
  N.pooler.pools.0.genpool_{w1,b1,w2,b2}_head   A/pooler/{w1,b1,w2,b2}         (local, atn)
  N.pooler.pools.0.genpool_one                  (not used: a constant 1)

Hyper-parameters: the models file holds no config (the experiment's yaml sits
beside it), so `configure` reads them from the tensor shapes: hidden_size,
mlp_dim, num_layers, pool_hidden, pool_heads, use_context, local_pooler (atn
when the local networks have GenPool tensors, else avg = official
avg_special), max_positions. The attention head count is not in any shape:
config.model.num_heads is kept (8 in every official COOT config). The input
widths must equal the config's (config.dataset / config.model video_dim and
text_dim: they select the features the config reads); a mismatch stops the
import naming the field and the config to pass. Not importable (stops with the
reason): more than one transformer layer per network (the official
TransformerEncoder feeds every layer the network's input, so only the last
layer's output counts; avtext chains its layers), a global network with an
attention pooler, and a pooler with several GenPools.

The imported model computes the official function with the default
`model.masked_pool=False` (avtext/models/coot.py); tests/test_parity_coot.py
checks it against the official code.
"""
import re

import numpy as np

from avtext.models import coot
from avtext.weights import official

DEFAULT_CONFIG = "configs/coot_activitynet.py"

NETWORKS = {"net_video_local": "video_local", "net_video_global": "video_global",
            "net_text_local": "text_local", "net_text_global": "text_global"}
_LEGACY_RENAMES = (("input_norm.", "norm_input."), ("input_fc.", "input_fc.mlp."),
                   ("pooler.genpool", "pooler.pools.0.genpool"))


def _rename_legacy(checkpoint: official.Checkpoint) -> None:
  """The first release's list of four state dicts ("0.input_norm.gain") -> current names."""
  names = list(NETWORKS)
  if not any(re.match(r"^[0-3]\.", k) for k in checkpoint.tensors):
    return
  renamed = {}
  for key, value in checkpoint.tensors.items():
    index, _, name = key.partition(".")
    if not index.isdigit() or int(index) >= len(names):
      raise official.ImportCheckpointError(
          f"{checkpoint.path}: tensor {key!r}: a list checkpoint holds the four COOT networks "
          f"{names} in this order")
    for old, new in _LEGACY_RENAMES:
      if not name.startswith(new):
        name = name.replace(old, new)
    renamed[f"{names[int(index)]}.{name}"] = value
  checkpoint.tensors.clear()
  checkpoint.tensors.update(renamed)


def _tensor(checkpoint: official.Checkpoint, name: str) -> np.ndarray:
  if name not in checkpoint.tensors:
    raise official.ImportCheckpointError(
        f"{checkpoint.path}: official tensor {name!r} missing; is this a COOT models file "
        f"(nntrainer model_<epoch>.pth, networks {list(NETWORKS)})? Its tensors start with "
        f"{sorted({k.split('.')[0] for k in checkpoint.tensors})}")
  return checkpoint.tensors[name]


def _layers(checkpoint: official.Checkpoint, prefix: str) -> int:
  found = {int(m.group(1)) for k in checkpoint.tensors
           if (m := re.match(re.escape(prefix) + r"\.encoder_layers\.(\d+)\.", k))}
  return max(found) + 1 if found else 0


def configure(config, checkpoint: official.Checkpoint):
  """Writes the shapes' hyper-parameters onto config.model (module docstring)."""
  _rename_legacy(checkpoint)
  path = checkpoint.path
  m = config.model
  w_in = _tensor(checkpoint, "net_video_local.input_fc.mlp.0.weight")
  ff = _tensor(checkpoint, "net_video_local.tf.encoder_layers.0.pointwise_feedforward_layer."
                           "sublayer.feed_forward.0.weight")
  for side in ("video", "text"):
    width = _tensor(checkpoint, f"net_{side}_local.norm_input.gain").shape[0]
    for section in ("dataset", "model"):
      have = config[section].get(f"{side}_dim")
      if have != width:
        raise ValueError(
            f"{path}: the {side} input width is {width} (net_{side}_local.norm_input.gain) but "
            f"config.{section}.{side}_dim={have}; pass the config of the checkpoint's dataset "
            f"(configs/coot_activitynet.py: 2048 / 1536, configs/coot_youcook2.py: 512 / 1536)")
  for net in NETWORKS:
    layers = _layers(checkpoint, f"{net}.tf")
    if layers != 1:
      raise ValueError(
          f"{path}: {net} has {layers} transformer layers; only 1 is importable (the official "
          "TransformerEncoder feeds every layer the network's input, so only the last layer "
          "counts, while avtext chains its layers: config.model.num_layers)")
    context = _layers(checkpoint, f"{net}.tf_context")
    if context > 1 or (context and "local" in net):
      raise ValueError(f"{path}: {net} has {context} context (cross-attention) layers; the "
                       "avtext COOT has one per global network")
    if any(k.startswith(f"{net}.pooler.pools.1.") for k in checkpoint.tensors):
      raise ValueError(f"{path}: {net}'s pooler stacks several GenPools (pooler_config."
                       "num_layers > 1); avtext's Attention-FA is one")
  if any(k.startswith(f"{n}.pooler.") for n in ("net_video_global", "net_text_global")
         for k in checkpoint.tensors):
    raise ValueError(f"{path}: the global networks use an attention pooler; avtext's global "
                     "pooler is the official avg_special mean")
  atn = "net_video_local.pooler.pools.0.genpool_w1_head" in checkpoint.tensors
  if atn != ("net_text_local.pooler.pools.0.genpool_w1_head" in checkpoint.tensors):
    raise ValueError(f"{path}: the video and text local networks use different poolers; "
                     "avtext's config.model.local_pooler is one")
  m.hidden_size = int(w_in.shape[0])
  m.mlp_dim = int(ff.shape[0])
  m.num_layers = 1
  m.use_context = "net_video_global.tf_context.encoder_layers.0.self_attention_layer." \
                  "sublayer.query_projection.weight" in checkpoint.tensors
  m.max_positions = int(_tensor(checkpoint, "net_video_local.embedding.pe").shape[0])
  if atn:
    w1 = _tensor(checkpoint, "net_video_local.pooler.pools.0.genpool_w1_head")
    m.local_pooler = "atn"
    m.pool_heads = int(w1.shape[0])
    m.pool_hidden = int(w1.shape[0] * w1.shape[2])
  elif m.local_pooler == "atn":
    m.local_pooler = "avg"  # official avg_special: model.masked_pool=False computes it
  if m.hidden_size % int(m.num_heads):
    raise ValueError(f"{path}: hidden size {m.hidden_size} is not divisible by "
                     f"config.model.num_heads={m.num_heads} (the head count is not stored in "
                     "the checkpoint; pass --config.model.num_heads)")
  return config


def _linear(porter, name: str, path: str) -> None:
  porter.copy(f"{name}.weight", f"{path}/kernel", official.linear_kernel)
  porter.copy(f"{name}.bias", f"{path}/bias")


def _norm(porter, name: str, path: str) -> None:
  porter.copy(f"{name}.gain", f"{path}/scale")
  porter.copy(f"{name}.bias", f"{path}/bias")


def _layer(porter, name: str, path: str, attention: str, heads: int) -> None:
  """One official TransformerEncoderLayer -> one avtext EncoderBlock."""
  sub = f"{name}.self_attention_layer.sublayer"
  for proj in ("query", "key", "value"):
    porter.copy(f"{sub}.{proj}_projection.weight", f"{path}/{attention}/{proj}/kernel",
                lambda w: official.heads_in(w, heads))
    porter.copy(f"{sub}.{proj}_projection.bias", f"{path}/{attention}/{proj}/bias",
                lambda b: official.heads_bias(b, heads))
  porter.copy(f"{sub}.final_projection.weight", f"{path}/{attention}/out/kernel",
              lambda w: official.heads_out(w, heads))
  porter.copy(f"{sub}.final_projection.bias", f"{path}/{attention}/out/bias")
  _norm(porter, f"{name}.self_attention_layer.layer_normalization", f"{path}/{attention}_norm")
  ff = f"{name}.pointwise_feedforward_layer"
  _linear(porter, f"{ff}.sublayer.feed_forward.0", f"{path}/mlp/dense_in")
  _linear(porter, f"{ff}.sublayer.feed_forward.3", f"{path}/mlp/dense_out")
  _norm(porter, f"{ff}.layer_normalization", f"{path}/mlp_norm")


def convert(checkpoint: official.Checkpoint, porter: official.Porter, config) -> None:
  """Every official tensor onto the avtext COOT (the table in the module docstring)."""
  m = config.model
  heads = int(m.num_heads)
  for net, module in NETWORKS.items():
    base = f"params/{module}"
    local = "local" in net
    _norm(porter, f"{net}.norm_input", f"{base}/norm_input")
    if local:
      _linear(porter, f"{net}.input_fc.mlp.0", f"{base}/input_fc")
    pe = porter.take(f"{net}.embedding.pe")
    # float32 torch arithmetic: ~1e-4 from the float64 table at position 999
    if pe.ndim == 2 and not np.allclose(pe, coot.sincos_table(*pe.shape), atol=1e-3):
      porter.errors.append(f"official tensor {net}.embedding.pe is not the sin-cos table "
                           "avtext recomputes (coot.sincos_table)")
    for i in range(int(m.num_layers)):
      _layer(porter, f"{net}.tf.encoder_layers.{i}", f"{base}/encoderblock_{i}", "attention",
             heads)
    if not local and m.use_context:
      _layer(porter, f"{net}.tf_context.encoder_layers.0", f"{base}/context", "cross_attention",
             heads)
    if local and m.local_pooler == "atn":
      pool = f"{net}.pooler.pools.0.genpool"
      for p in ("w1", "b1", "w2", "b2"):
        porter.copy(f"{pool}_{p}_head", f"{base}/pooler/{p}")
      porter.skip(f"{pool}_one")
