r"""Official TVR XML checkpoint (jayleicn/TVRetrieval) -> avtext `XML` parameters.

    python -m avtext.import_checkpoint --system=xml --checkpoint=model.ckpt --out=RUNDIR

The checkpoint: baselines/crossmodal_moment_localization/train.py writes
`torch.save({"model": model.state_dict(), "model_cfg": model.config, "epoch": i}, ...)`
(`opt.ckpt_filepath`, results/<exp>/model.ckpt) whenever the stop metric improves (and
every epoch without validation). `model_cfg` is the EasyDict the model was built from
(train.py `model_config`); the reader gives it back as a plain dict, and `configure`
writes it onto config.model:

  model_cfg                     config
  ctx_mode  video_sub[_tef]     model.context = "video_sub", model.use_tef = "tef" in it
  hidden_size, n_heads          model.hidden_size, model.num_heads
  max_ctx_l, max_desc_l         model.max_ctx_len, model.max_query_len
  drop, input_drop              model.dropout_rate, model.input_dropout_rate
  conv_kernel_size              model.conv_kernel_size
  margin, hard_pool_size        loss.margin, loss.hard_pool_size
  visual_/sub_/query_input_size checked against dataset.video_dim / sub_dim / query_dim
                                (+ 2 TEF features on video and sub with tef)
and requires the official architecture: cross_att, merge_two_stream, span_predictor_type
"conv" with one kernel (stack_conv_predictor_conv_kernel_sizes -1, conv_stride 1),
encoder_type "transformer", no_modular False; on the avtext side span_query_linear=True
(official), cross_output_linear=False (the official Cross-Encoder has no Linear) and
span_head "convse". A conflict stops the import naming the field. masked_convse is
left as configured (it changes no parameter; the default is the official function).
Only ctx_mode video_sub imports: the official single-stream model (ctx_mode video or
sub) has a third self-encoder (<m>_encoder3) and per-stream predictors, which avtext's
single-stream XML does not.

Tensor mapping (torch Linear weight [out, in] -> Dense kernel [in, out]; attention
query/key/value -> DenseGeneral [D, H, D/H]; LayerNorm weight -> scale):

  official                                     avtext (params/...)
  query_input_proj.LayerNorm.*                 query_proj/norm
  query_input_proj.net.1.*                     query_proj/dense
  query_pos_embed.position_embeddings.weight   query_pos/embedding
  query_pos_embed.LayerNorm.*                  query_pos/norm
  query_encoder.self.{query,key,value}.*       query_encoder/attention/{query,key,value}
  query_encoder.output.dense.*                 query_encoder/attention/out
  query_encoder.output.LayerNorm.*             query_encoder/attention_norm
  modular_vector_mapping.weight [M, D]         modular/kernel [D, M] (video, sub)
  ctx_pos_embed.*                              ctx_pos/{embedding,norm}
  <m>_input_proj.*                             <m>_proj/{norm,dense}       m = video, sub
  <m>_encoder1.*  (before cross-attention)     <m>_encoder0/...
  <m>_cross_att.{query,key,value}.*            <m>_cross/cross_attention/{query,key,value}
  <m>_cross_layernorm.*                        <m>_cross/cross_attention_norm
  <m>_encoder2.*  (after cross-attention)      <m>_encoder1/...
  <m>_query_linear.*                           <m>_span_query
  merged_{st,ed}_predictor.weight [1, 1, k]    convse/{start,end}/kernel [k, 1, 1]
"""
from typing import Any

import numpy as np

from avtext.weights import official

DEFAULT_CONFIG = "configs/xml_tvr.py"
STREAMS = ("video", "sub")

# model_cfg key -> (config.model field, type)
_MODEL_FIELDS = {
    "hidden_size": ("hidden_size", int),
    "n_heads": ("num_heads", int),
    "max_ctx_l": ("max_ctx_len", int),
    "max_desc_l": ("max_query_len", int),
    "drop": ("dropout_rate", float),
    "input_drop": ("input_dropout_rate", float),
    "conv_kernel_size": ("conv_kernel_size", int),
}
# model_cfg key -> the value the avtext XML computes (absent keys: the official default)
_REQUIRED = {
    "cross_att": True,
    "merge_two_stream": True,
    "span_predictor_type": "conv",
    "encoder_type": "transformer",
    "stack_conv_predictor_conv_kernel_sizes": -1,
    "conv_stride": 1,
    "no_modular": False,
}


def _model_cfg(checkpoint: official.Checkpoint) -> dict[str, Any]:
  cfg = checkpoint.meta.get("model_cfg")
  if cfg is None:
    return {}
  if not isinstance(cfg, dict):
    raise ValueError(f"{checkpoint.path}: model_cfg is a {type(cfg).__name__}, expected the "
                     "EasyDict train.py saves (read back as a dict)")
  return cfg


def configure(config, checkpoint: official.Checkpoint):
  """The checkpoint's model_cfg onto config.model / config.loss (module docstring)."""
  where = f"{checkpoint.path}: model_cfg"
  m = config.model
  problems = []
  if m.get("name", "xml") != "xml":
    problems.append(f"config.model.name={m.name!r}; an XML checkpoint needs 'xml'")
  for field, want in (("span_query_linear", True), ("cross_output_linear", False),
                      ("span_head", "convse")):
    if m.get(field) is not None and m.get(field) != want:
      problems.append(f"config.model.{field}={m.get(field)!r}; the official XML has "
                      f"{field}={want!r} (the parameters would not fit)")
  cfg = _model_cfg(checkpoint)
  if cfg:
    for key, want in _REQUIRED.items():
      if key in cfg and cfg[key] != want:
        problems.append(f"{where}.{key}={cfg[key]!r}; avtext's XML implements {want!r}")
    ctx_mode = str(cfg.get("ctx_mode", "video_sub"))
    use_tef = "tef" in ctx_mode.split("_")
    context = "_".join(s for s in ctx_mode.split("_") if s != "tef")
    if context != "video_sub":
      problems.append(f"{where}.ctx_mode={ctx_mode!r}; only video_sub[_tef] imports (the "
                      "official single-stream XML has a third self-encoder, <m>_encoder3, "
                      "and per-stream span predictors)")
    for key, want_dim in (("visual_input_size", "video_dim"), ("sub_input_size", "sub_dim"),
                          ("query_input_size", "query_dim")):
      if key not in cfg or config.get("dataset") is None:
        continue
      have = config.dataset.get(want_dim)
      extra = 2 if use_tef and key != "query_input_size" else 0
      if have is not None and int(have) + extra != int(cfg[key]):
        problems.append(f"{where}.{key}={cfg[key]} but config.dataset.{want_dim}={have}"
                        f"{' (+2 TEF)' if extra else ''}: the features do not fit the model")
    if problems:
      raise ValueError("import --system=xml:\n  - " + "\n  - ".join(problems))
    m.context, m.use_tef = context, use_tef
    for key, (field, cast) in _MODEL_FIELDS.items():
      if key in cfg:
        m[field] = cast(cfg[key])
    if config.get("loss") is not None:
      if "margin" in cfg:
        config.loss.margin = float(cfg["margin"])
      if "hard_pool_size" in cfg:
        config.loss.hard_pool_size = int(cfg["hard_pool_size"])
  elif problems:
    raise ValueError("import --system=xml:\n  - " + "\n  - ".join(problems))
  else:  # no model_cfg: the shapes are checked against the config's model by the Porter
    if m.get("context", "video_sub") != "video_sub":
      raise ValueError(f"config.model.context={m.context!r}; only video_sub imports")
  return config


def _linear(porter: official.Porter, name: str, path: str) -> None:
  porter.copy(f"{name}.weight", f"{path}/kernel", official.linear_kernel)
  porter.copy(f"{name}.bias", f"{path}/bias")


def _layer_norm(porter: official.Porter, name: str, path: str) -> None:
  porter.copy(f"{name}.weight", f"{path}/scale")
  porter.copy(f"{name}.bias", f"{path}/bias")


def _heads(porter: official.Porter, name: str, path: str, num_heads: int) -> None:
  """BertSelfAttention query/key/value -> Attention query/key/value."""
  for part in ("query", "key", "value"):
    porter.copy(f"{name}.{part}.weight", f"{path}/{part}/kernel",
                lambda w: official.heads_in(w, num_heads))
    porter.copy(f"{name}.{part}.bias", f"{path}/{part}/bias",
                lambda b: official.heads_bias(b, num_heads))


def _bert_attention(porter: official.Porter, name: str, path: str, num_heads: int) -> None:
  """BertAttention (self + output) -> `models.xml.SelfEncoder` (no feed-forward part)."""
  _heads(porter, f"{name}.self", f"params/{path}/attention", num_heads)
  porter.copy(f"{name}.output.dense.weight", f"params/{path}/attention/out/kernel",
              lambda w: official.heads_out(w, num_heads))
  porter.copy(f"{name}.output.dense.bias", f"params/{path}/attention/out/bias")
  _layer_norm(porter, f"{name}.output.LayerNorm", f"params/{path}/attention_norm")


def _input(porter: official.Porter, proj: str, path: str) -> None:
  _layer_norm(porter, f"{proj}.LayerNorm", f"params/{path}/norm")
  _linear(porter, f"{proj}.net.1", f"params/{path}/dense")


def _positions(porter: official.Porter, name: str, path: str) -> None:
  porter.copy(f"{name}.position_embeddings.weight", f"params/{path}/embedding")
  _layer_norm(porter, f"{name}.LayerNorm", f"params/{path}/norm")


def convert(checkpoint: official.Checkpoint, porter: official.Porter, config) -> None:
  """Every official tensor onto its avtext leaf (module docstring: the table)."""
  del checkpoint
  heads = int(config.model.num_heads)
  _input(porter, "query_input_proj", "query_proj")
  _positions(porter, "query_pos_embed", "query_pos")
  _bert_attention(porter, "query_encoder", "query_encoder", heads)
  porter.copy("modular_vector_mapping.weight", "params/modular/kernel", official.linear_kernel)
  _positions(porter, "ctx_pos_embed", "ctx_pos")
  for m in STREAMS:
    _input(porter, f"{m}_input_proj", f"{m}_proj")
    _bert_attention(porter, f"{m}_encoder1", f"{m}_encoder0", heads)
    _heads(porter, f"{m}_cross_att", f"params/{m}_cross/cross_attention", heads)
    _layer_norm(porter, f"{m}_cross_layernorm", f"params/{m}_cross/cross_attention_norm")
    _bert_attention(porter, f"{m}_encoder2", f"{m}_encoder1", heads)
    _linear(porter, f"{m}_query_linear", f"params/{m}_span_query")
  for official_name, ours in (("merged_st_predictor", "start"), ("merged_ed_predictor", "end")):
    porter.copy(f"{official_name}.weight", f"params/convse/{ours}/kernel",
                lambda w: np.asarray(w).transpose(2, 1, 0))  # [out, in, k] -> [k, in, out]


def to_official(params) -> dict[str, np.ndarray]:
  """The inverse of `convert`: avtext XML params (video_sub) -> the official state dict
  names and layouts (tests build official checkpoints from a model with it)."""
  p = {k: np.asarray(v) for k, v in official.flatten(params).items()}
  out: dict[str, np.ndarray] = {}

  def linear(name, path):
    out[f"{name}.weight"] = p[f"{path}/kernel"].T
    out[f"{name}.bias"] = p[f"{path}/bias"]

  def norm(name, path):
    out[f"{name}.weight"], out[f"{name}.bias"] = p[f"{path}/scale"], p[f"{path}/bias"]

  def heads(name, path):
    for part in ("query", "key", "value"):
      k = p[f"{path}/{part}/kernel"]
      out[f"{name}.{part}.weight"] = k.reshape(k.shape[0], -1).T
      out[f"{name}.{part}.bias"] = p[f"{path}/{part}/bias"].reshape(-1)

  def bert(name, path):
    heads(f"{name}.self", f"{path}/attention")
    k = p[f"{path}/attention/out/kernel"]
    out[f"{name}.output.dense.weight"] = k.reshape(-1, k.shape[-1]).T
    out[f"{name}.output.dense.bias"] = p[f"{path}/attention/out/bias"]
    norm(f"{name}.output.LayerNorm", f"{path}/attention_norm")

  def inp(name, path):
    norm(f"{name}.LayerNorm", f"{path}/norm")
    linear(f"{name}.net.1", f"{path}/dense")

  def pos(name, path):
    out[f"{name}.position_embeddings.weight"] = p[f"{path}/embedding"]
    norm(f"{name}.LayerNorm", f"{path}/norm")

  inp("query_input_proj", "query_proj")
  pos("query_pos_embed", "query_pos")
  bert("query_encoder", "query_encoder")
  out["modular_vector_mapping.weight"] = p["modular/kernel"].T
  pos("ctx_pos_embed", "ctx_pos")
  for m in STREAMS:
    inp(f"{m}_input_proj", f"{m}_proj")
    bert(f"{m}_encoder1", f"{m}_encoder0")
    heads(f"{m}_cross_att", f"{m}_cross/cross_attention")
    norm(f"{m}_cross_layernorm", f"{m}_cross/cross_attention_norm")
    bert(f"{m}_encoder2", f"{m}_encoder1")
    linear(f"{m}_query_linear", f"{m}_span_query")
  out["merged_st_predictor.weight"] = p["convse/start/kernel"].transpose(2, 1, 0)
  out["merged_ed_predictor.weight"] = p["convse/end/kernel"].transpose(2, 1, 0)
  return {k: np.ascontiguousarray(v, np.float32) for k, v in out.items()}
