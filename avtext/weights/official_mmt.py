"""Official TVCaption MMT checkpoints -> avtext (`import_checkpoint --system=mmt`).

The checkpoint: jayleicn/TVCaption baselines/multimodal_transformer/train.py writes,
after every epoch that improves the validation CIDEr (save_mode "best", `<res_dir>/
model.chkpt`; save_mode "all": `model_acc_<cider>.chkpt`),

    torch.save({"model": model.state_dict(), "model_cfg": model.config (EasyDict),
                "opt": opt (argparse.Namespace), "epoch": epoch_i}, path)

`avtext.weights.official.read_checkpoint` returns the "model" state dict as tensors and
the rest, as plain dicts, as meta. The same state dict as .npz (with model_cfg / opt in
its `__meta__`) imports without torch.

Hyper-parameters (`configure`): the tensor shapes give vocab_size, word_dim,
hidden_size, intermediate_size, video_dim, max_positions and num_layers; model_cfg
gives num_heads, layer_norm_eps and the dropout rates; loss.label_smoothing comes from
the buffer loss_func.one_hot (eps / (V - 1); absent: the official plain cross-entropy,
eps 0) and must agree with model_cfg.label_smoothing; opt gives
data.max_v_len / max_sub_len / max_cap_len and data.context (ctx_mode). Without meta
the shapes alone are used and the rest stays as the config has it. What the avtext model
cannot express stops the import naming the field: share_wd_cls_weight=True (tied
classifier), type_vocab_size != 2, intermediate_size != hidden_size (the official
decoder layer then does not run), model.decoder_layer other than "official", and
features the official dataset L2-normalizes (opt.no_norm_vfeat false; avtext reads the
features as stored).

The vocabulary: evaluating needs the word2idx JSON the official model was trained with
(build_vocab.py, opt.word2idx_path, e.g. cache/tvc_word2idx.json). `configure` takes
config.model.vocab when set (--config.model.vocab=FILE), else a file beside the
checkpoint named word2idx.json or like opt.word2idx_path's file name; its length must
equal the checkpoint's vocabulary. The run's config.json records its absolute path.

Tensor mapping (official name -> avtext leaf; W^T: torch [out, in] -> flax [in, out];
heads: [H*Dh, D] -> [D, H, Dh]; LayerNorm weight -> scale):

  embeddings.word_embeddings.weight           params/word_embeddings/embedding
  embeddings.word_fc.{0,2,4}.*                params/word_fc/{norm_in, dense (W^T), norm_out}
  embeddings.video_embeddings.{0,2,4}.*       params/video_fc/{norm_in, dense (W^T), norm_out}
  embeddings.position_embeddings.pe           (buffer: the sinusoid, recomputed; checked)
  embeddings.token_type_embeddings.weight     params/token_type_embeddings/embedding
  embeddings.LayerNorm.*                      params/embedding_norm
  encoder.layer.i.attention.self.{query,key,value}.*
                                              params/encoder_i/attention/{query,key,value} (heads)
  encoder.layer.i.attention.output.dense.*    params/encoder_i/attention/out (heads out)
  encoder.layer.i.attention.output.LayerNorm.* params/encoder_i/attention_norm
  encoder.layer.i.hidden_intermediate.dense.* params/encoder_i/mlp/dense_in (W^T)
  encoder.layer.i.output.dense.*              params/encoder_i/mlp/dense_out (W^T)
  encoder.layer.i.output.LayerNorm.*          params/encoder_i/mlp_norm
  encoder.layer.i.memory_intermediate.dense.* (unused by the official forward: skipped)
  decoder.layer.i.self_attention.{query,key,value}.*
                                              params/decoder_i/attention/{query,key,value}
  decoder.layer.i.norm1.*                     params/decoder_i/attention_norm
  decoder.layer.i.dec_enc_attention.{query,key,value}.*
                                              params/decoder_i/cross_attention/{query,key,value}
  decoder.layer.i.norm2.*                     params/decoder_i/cross_attention_norm
  decoder.layer.i.output.dense.*              params/decoder_i/mlp (W^T)
  decoder.layer.i.output.LayerNorm.*          params/decoder_i/mlp_norm
  decoder_classifier.transform.dense.*        params/head_transform (W^T)
  decoder_classifier.transform.LayerNorm.*    params/head_norm
  decoder_classifier.decoder.weight           params/head_output/kernel (W^T)
  decoder_classifier.bias                     params/head_output/bias
  loss_func.one_hot                           (buffer: the smoothed target row; checked
                                               against loss.label_smoothing)
"""
import copy
import pathlib
import re

import numpy as np

from avtext.models import mmt as mmt_lib
from avtext.weights import official

DEFAULT_CONFIG = "configs/mmt_tvc.py"
VOCAB_FILE = "word2idx.json"  # looked for beside the checkpoint


def _layers(names, prefix: str) -> int:
  found = {int(m.group(1)) for n in names for m in [re.match(rf"{prefix}\.(\d+)\.", n)] if m}
  if found != set(range(len(found))):
    raise official.ImportCheckpointError(f"{prefix}.<i>: layers {sorted(found)} are not 0..n-1")
  return len(found)


def _need(tensors, name: str, path) -> np.ndarray:
  if name not in tensors:
    raise official.ImportCheckpointError(
        f"{path}: official tensor {name!r} missing; is this a TVCaption MMT checkpoint "
        f"(multimodal_transformer/train.py)? It holds {sorted(tensors)[:8]}...")
  return tensors[name]


def _find_vocab(config, checkpoint: official.Checkpoint, opt: dict) -> pathlib.Path:
  if config.model.get("vocab"):
    return pathlib.Path(config.model.vocab).absolute()
  names = [VOCAB_FILE]
  if opt.get("word2idx_path"):
    names.append(pathlib.PurePath(str(opt["word2idx_path"])).name)
  for name in names:
    candidate = checkpoint.path.parent / name
    if candidate.is_file():
      return candidate.absolute()
  raise ValueError(
      f"config.model.vocab is not set and no {' or '.join(names)} lies beside "
      f"{checkpoint.path}: evaluating the imported MMT needs the word2idx JSON it was "
      "trained with (TVCaption build_vocab.py, opt.word2idx_path); pass "
      "--config.model.vocab=FILE or put it beside the checkpoint")


def configure(config, checkpoint: official.Checkpoint):
  """The checkpoint's hyper-parameters onto `config` (module docstring)."""
  t, path = checkpoint.tensors, checkpoint.path
  cfg = dict(checkpoint.meta.get("model_cfg") or {})
  opt = dict(checkpoint.meta.get("opt") or {})
  m = config.model
  if m.get("name") != "mmt":
    raise ValueError(f"config.model.name={m.get('name')!r}: --system=mmt imports into the "
                     f"MMT captioner ({DEFAULT_CONFIG})")
  if m.get("decoder_layer", "official") != "official":
    raise ValueError(f"config.model.decoder_layer={m.decoder_layer!r}: the official weights "
                     "fit only the official decoder layer; leave it 'official'")
  if cfg.get("share_wd_cls_weight"):
    raise ValueError(f"{path}: model_cfg.share_wd_cls_weight=True (classifier tied to the word "
                     "embedding) has no avtext MMT counterpart (its head_output is untied)")
  if cfg.get("type_vocab_size", 2) != 2:
    raise ValueError(f"{path}: model_cfg.type_vocab_size={cfg['type_vocab_size']}; the avtext "
                     "MMT has 2 token types (video, text)")
  if opt and not opt.get("no_norm_vfeat", True):
    raise ValueError(f"{path}: opt.no_norm_vfeat=False, the official dataset L2-normalized "
                     "the clip features; avtext feeds them as stored (use features saved "
                     "normalized, as the official 3072-d resnet_i3d ones are)")

  # Shapes: always from the tensors.
  vocab_size, word_dim = _need(t, "embeddings.word_embeddings.weight", path).shape
  hidden, video_dim = _need(t, "embeddings.video_embeddings.2.weight", path).shape
  max_positions = _need(t, "embeddings.position_embeddings.pe", path).shape[0]
  intermediate = _need(t, "encoder.layer.0.hidden_intermediate.dense.weight", path).shape[0]
  num_layers = _layers(t, "encoder.layer")
  if _layers(t, "decoder.layer") != num_layers:
    raise official.ImportCheckpointError(
        f"{path}: {num_layers} encoder but {_layers(t, 'decoder.layer')} decoder layers; "
        "the official MMT has num_hidden_layers of each")
  if intermediate != hidden:
    raise ValueError(f"{path}: intermediate_size={intermediate} != hidden_size={hidden}; the "
                     "official decoder layer (BertOutput on a hidden-wide input) needs them equal")
  shapes = dict(vocab_size=vocab_size, word_vec_size=word_dim, hidden_size=hidden,
                video_feature_size=video_dim, max_position_embeddings=max_positions,
                intermediate_size=intermediate, num_hidden_layers=num_layers)
  for key, value in shapes.items():
    if key in cfg and int(cfg[key]) != int(value):
      raise official.ImportCheckpointError(
          f"{path}: model_cfg.{key}={cfg[key]} but the tensors say {value}")
  m.vocab_size, m.word_dim, m.hidden_size = int(vocab_size), int(word_dim), int(hidden)
  m.video_dim = config.dataset.video_dim = int(video_dim)
  m.max_positions, m.intermediate_size = int(max_positions), int(intermediate)
  m.num_layers = int(num_layers)
  m.decoder_layer = "official"

  # The rest: from model_cfg / opt when present.
  for src, dst, cast in (("num_attention_heads", "num_heads", int),
                         ("layer_norm_eps", "layer_norm_eps", float),
                         ("hidden_dropout_prob", "dropout_rate", float),
                         ("attention_probs_dropout_prob", "attention_dropout_rate", float)):
    if src in cfg:
      m[dst] = cast(cfg[src])
  if hidden % int(m.num_heads):
    raise ValueError(f"config.model.num_heads={m.num_heads} does not divide hidden_size="
                     f"{hidden} (the checkpoint has no model_cfg: pass --config.model.num_heads)")
  # LabelSmoothingLoss keeps eps / (V - 1) per word as the buffer loss_func.one_hot; with
  # label_smoothing 0 the official loss is nn.CrossEntropyLoss, which has no buffer.
  eps = 0.0
  if "loss_func.one_hot" in t:
    eps = round(float(t["loss_func.one_hot"].reshape(-1)[0]) * (vocab_size - 1), 6)
  if "label_smoothing" in cfg and abs(eps - float(cfg["label_smoothing"] or 0.0)) > 1e-5:
    raise official.ImportCheckpointError(
        f"{path}: loss_func.one_hot says label_smoothing {eps:g}, model_cfg "
        f"{cfg['label_smoothing']}")
  config.loss.label_smoothing = float(cfg.get("label_smoothing") or eps)
  for key in ("max_v_len", "max_sub_len", "max_cap_len"):
    if key in opt:
      config.data[key] = int(opt[key])
  if "ctx_mode" in opt:
    config.data.context = str(opt["ctx_mode"])
  if int(config.data.max_v_len) + int(config.data.max_sub_len) > max_positions:
    raise ValueError(f"config.data.max_v_len + max_sub_len = {config.data.max_v_len} + "
                     f"{config.data.max_sub_len} > the checkpoint's {max_positions} positions")
  if config.get("generation") is not None and "max_cap_len" in opt:
    config.generation.max_new_tokens = int(opt["max_cap_len"]) - 1  # the official greedy loop

  vocab = _find_vocab(config, checkpoint, opt)
  probe = copy.deepcopy(m)  # the model factory sizes the vocabulary as a run will
  probe.vocab, probe.vocab_size = str(vocab), None
  words = mmt_lib.mmt_from_config(probe).vocab_size
  if words != vocab_size:
    raise ValueError(f"config.model.vocab={vocab}: {words} words, but the checkpoint's "
                     f"embedding has {vocab_size}")
  m.vocab = str(vocab)
  return config


def convert(checkpoint: official.Checkpoint, porter: official.Porter, config) -> None:
  """Every official tensor onto the avtext MMT (module docstring: the table)."""
  m = config.model
  heads, hidden = int(m.num_heads), int(m.hidden_size)
  kernel = official.linear_kernel

  def linear(src: str, dst: str):
    porter.copy(f"{src}.weight", f"params/{dst}/kernel", kernel)
    porter.copy(f"{src}.bias", f"params/{dst}/bias")

  def norm(src: str, dst: str):
    porter.copy(f"{src}.weight", f"params/{dst}/scale")
    porter.copy(f"{src}.bias", f"params/{dst}/bias")

  def attention(src: str, dst: str):
    for part in ("query", "key", "value"):
      porter.copy(f"{src}.{part}.weight", f"params/{dst}/{part}/kernel",
                  lambda w: official.heads_in(w, heads))
      porter.copy(f"{src}.{part}.bias", f"params/{dst}/{part}/bias",
                  lambda b: official.heads_bias(b, heads))

  e = "embeddings"
  porter.copy(f"{e}.word_embeddings.weight", "params/word_embeddings/embedding")
  for src, dst in (("word_fc", "word_fc"), ("video_embeddings", "video_fc")):
    norm(f"{e}.{src}.0", f"{dst}/norm_in")
    linear(f"{e}.{src}.2", f"{dst}/dense")
    norm(f"{e}.{src}.4", f"{dst}/norm_out")
  pe = porter.take(f"{e}.position_embeddings.pe")
  want = mmt_lib.sinusoidal_positions(int(m.max_positions), hidden)
  if pe.shape == want.shape and np.max(np.abs(pe - want)) > 1e-4:
    porter.errors.append(f"official tensor '{e}.position_embeddings.pe' is not the sinusoid "
                         "avtext recomputes (max |diff| "
                         f"{np.max(np.abs(pe - want)):.2g})")
  porter.copy(f"{e}.token_type_embeddings.weight", "params/token_type_embeddings/embedding")
  norm(f"{e}.LayerNorm", "embedding_norm")

  for i in range(int(m.num_layers)):
    src, dst = f"encoder.layer.{i}", f"encoder_{i}"
    attention(f"{src}.attention.self", f"{dst}/attention")
    porter.copy(f"{src}.attention.output.dense.weight", f"params/{dst}/attention/out/kernel",
                lambda w: official.heads_out(w, heads))
    porter.copy(f"{src}.attention.output.dense.bias", f"params/{dst}/attention/out/bias")
    norm(f"{src}.attention.output.LayerNorm", f"{dst}/attention_norm")
    linear(f"{src}.hidden_intermediate.dense", f"{dst}/mlp/dense_in")
    linear(f"{src}.output.dense", f"{dst}/mlp/dense_out")
    norm(f"{src}.output.LayerNorm", f"{dst}/mlp_norm")
    # Built by BertLayerNoMemoryUntied but never called in its forward.
    porter.skip(f"{src}.memory_intermediate.dense.weight")
    porter.skip(f"{src}.memory_intermediate.dense.bias")

    src, dst = f"decoder.layer.{i}", f"decoder_{i}"
    attention(f"{src}.self_attention", f"{dst}/attention")
    norm(f"{src}.norm1", f"{dst}/attention_norm")
    attention(f"{src}.dec_enc_attention", f"{dst}/cross_attention")
    norm(f"{src}.norm2", f"{dst}/cross_attention_norm")
    linear(f"{src}.output.dense", f"{dst}/mlp")
    norm(f"{src}.output.LayerNorm", f"{dst}/mlp_norm")

  linear("decoder_classifier.transform.dense", "head_transform")
  norm("decoder_classifier.transform.LayerNorm", "head_norm")
  porter.copy("decoder_classifier.decoder.weight", "params/head_output/kernel", kernel)
  porter.copy("decoder_classifier.bias", "params/head_output/bias")
  if porter.has("loss_func.one_hot"):  # checked in configure
    porter.skip("loss_func.one_hot")
