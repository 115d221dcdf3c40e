"""Start MBT's RGB and audio towers from a 2D ViT (VideoCC §5.2, app. C: ImageNet-21k ViT-B/16).

Checkpoints, read with numpy / safetensors (no torch, no hub):
  npz  vit_jax / scenic / big_vision (e.g. ViT-B_16.npz, the AugReg i21k files):
         embedding/kernel [ph, pw, 3, D], embedding/bias, cls [1, 1, D],
         Transformer/posembed_input/pos_embedding [1, 1 + N, D],
         Transformer/encoderblock_<i>/{LayerNorm_0, MultiHeadDotProductAttention_1/
           {query,key,value}/kernel [D, H, D/H], out/kernel [H, D/H, D], LayerNorm_2,
           MlpBlock_3/Dense_0, Dense_1}, Transformer/encoder_norm;
       big_vision's own names are accepted too: MultiHeadDotProductAttention_0,
       LayerNorm_1, MlpBlock_0, a top-level pos_embedding [1, N, D] added before the [CLS]
       is prepended (the [CLS] then gets a zero position), no cls for GAP / MAP models
       (the tower keeps its own), layers stacked as Transformer/encoderblock [L, ...]
       (scan=True), and any common prefix such as params/. Heads (head, pre_logits,
       MAPHead_0) are not read.
  hf   a transformers ViTModel directory: config.json + model.safetensors
       ([vit.]embeddings.patch_embeddings.projection.weight [D, 3, ph, pw], Linear
       weights [out, in]); pooler.* and classifier.* are ignored.

Into `avtext.models.mbt.ModalityTower` params (MBT, Nagrani et al. 2021, which starts
from ViT the way ViViT does):
  rgb    the 2D kernel inflated to the (t, ph, pw) tubelet, `rgb_init`:
           central_frame  kernel on frame t // 2, zeros elsewhere: the tower starts as
                          the image ViT on each tubelet's centre frame (ViViT's best
                          initialiser; the default);
           average        kernel / t on every frame (I3D's filter inflation): a static
                          video embeds exactly like the image.
         Positions: [CLS]'s kept; the 2D grid resized to the tower's per-frame grid
         (H / ph, W / pw) and repeated for each of the T / t tubelet times, time-major as
         the tower flattens its tokens (MBT's "resize_tile", ViViT's "tile"). The tower so
         starts with no temporal position signal; training learns one.
  audio  the same image weights on the 1-channel log-mel [time, mel]: the kernel summed
         over its 3 input channels. MBT feeds the spectrogram repeated on 3 channels to
         the unchanged RGB kernel, AST sums the kernel; both are this sum. Positions: the
         grid resized to (time / pt, mel / pf), image rows = time, as MBT does.
  both   [CLS], every encoder block and the final LayerNorm copy over unchanged.
Resizing is bilinear with the corner positions kept (scipy.ndimage.zoom(order=1), what
MBT, ViViT and big_vision use); an unchanged grid is copied exactly.

The checkpoint fixes width, depth, heads, MLP width and the 2D patch size; a tower
configured otherwise is an error naming the file, the checkpoint key and the config
field. config.model.video.init_from_vit (configs/videocc_avr.py): path, format
(auto: a directory is hf, a file npz), rgb_init, towers.
"""
import dataclasses
import json
import pathlib
import re
from typing import Any

from absl import logging
from flax import traverse_util
import numpy as np

from avtext.modalities import parse_modalities

# configs/videocc_avr.py's default init_from_vit.path.
DEFAULT_PATH = "~/.cache/avtext/vit/ViT-B_16.npz"
DOWNLOAD = ("Get ViT-B/16 ImageNet-21k weights, the vit_jax npz "
            "gs://vit_models/imagenet21k/ViT-B_16.npz (gsutil cp, or https://storage."
            "googleapis.com/vit_models/imagenet21k/ViT-B_16.npz), and put it at "
            f"{DEFAULT_PATH}, or point --config.model.video.init_from_vit.path at it or at a "
            "Hugging Face google/vit-base-patch16-224-in21k directory (config.json + "
            "model.safetensors); --config.model.video.init_from_vit.path= (empty) starts "
            "MBT from scratch")
RGB_INITS = ("central_frame", "average")
# Activations whose ViT weights fit MBT's tanh-GELU (exact and tanh GELU differ by ~1e-3).
_HF_GELUS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast")
_HF_UNUSED = ("pooler.", "classifier.")


@dataclasses.dataclass
class ViTWeights:
  """A 2D ViT in the tower's parameter paths, before inflation and resizing.

  params: 'patch_embedding/kernel' [ph, pw, 3, D], 'patch_embedding/bias', 'cls'
    [1, 1, D] (absent for a model without one), 'posembed/pos_embedding' [1 + gs * gs, D]
    (row 0 the [CLS]'s), 'encoderblock_<i>/...', 'encoder_norm/{scale,bias}'.
  keys: the same paths -> the checkpoint's own names, for error messages.
  """
  source: str
  params: dict[str, np.ndarray]
  keys: dict[str, str]
  num_heads: int
  heads_key: str

  @property
  def num_layers(self) -> int:
    return _count_blocks(self.params)


def _count_blocks(flat: dict[str, Any]) -> int:
  return sum(1 for k in flat if re.fullmatch(r"encoderblock_\d+/attention_norm/scale", k))


def _with_cls_position(pos: np.ndarray, source: str, key: str) -> np.ndarray:
  """[L, D] -> [1 + N, D]: a square grid gets a zero [CLS] row (added after posemb)."""
  n = pos.shape[0]
  if int(round(np.sqrt(n))) ** 2 == n:
    return np.concatenate([np.zeros_like(pos[:1]), pos])
  if int(round(np.sqrt(n - 1))) ** 2 == n - 1:
    return pos
  raise ValueError(f"{source}: {key} has {n} positions, neither a square patch grid nor "
                   "[CLS] + a square grid")


def read_npz(path: str | pathlib.Path) -> ViTWeights:
  """A vit_jax / scenic / big_vision ViT .npz (module docstring)."""
  path = pathlib.Path(path)
  try:
    f = np.load(path)
  except ValueError as e:  # a pickle or a text file
    raise ValueError(f"{path}: not an .npz of arrays ({e}); a Hugging Face ViT is a "
                     "directory (init_from_vit.format=hf)") from e
  if not isinstance(f, np.lib.npyio.NpzFile):
    raise ValueError(f"{path}: one array, not a ViT .npz of named arrays")
  with f:
    raw = {k: f[k] for k in f.files}
  # The ViT's root: where embedding/kernel sits beside Transformer/encoder_norm.
  prefixes = [k[:-len("embedding/kernel")] for k in raw if k.endswith("embedding/kernel")]
  prefixes = [p for p in prefixes
              if (not p or p.endswith("/")) and f"{p}Transformer/encoder_norm/scale" in raw]
  if len(prefixes) != 1:
    raise KeyError(f"{path}: {len(prefixes)} places with embedding/kernel beside "
                   f"Transformer/encoder_norm/scale ({prefixes}), want 1; not a vit_jax / "
                   f"big_vision ViT npz? Keys start {sorted(raw)[:5]}")
  prefix = prefixes[0]
  w = {k[len(prefix):]: v for k, v in raw.items() if k.startswith(prefix)}
  params: dict[str, np.ndarray] = {}
  keys: dict[str, str] = {}

  def take(ours: str, *names: str, arr: dict = w, label=lambda n: prefix + n) -> None:
    for n in names:
      if n in arr:
        params[ours] = np.asarray(arr[n], np.float32)
        keys[ours] = label(n)
        return
    raise KeyError(f"{path}: no {label(names[0])!r} (a ViT npz has "
                   f"{' or '.join(label(n) for n in names)})")

  take("patch_embedding/kernel", "embedding/kernel")
  take("patch_embedding/bias", "embedding/bias")
  if "cls" in w:
    take("cls", "cls")
  else:
    logging.info("%s: no cls (a GAP / MAP model); the towers keep their own [CLS]", path)
  take("posembed/pos_embedding", "Transformer/posembed_input/pos_embedding", "pos_embedding",
       "Transformer/pos_embedding")
  pos = params["posembed/pos_embedding"]
  params["posembed/pos_embedding"] = _with_cls_position(
      pos.reshape(pos.shape[-2], pos.shape[-1]), str(path), keys["posembed/pos_embedding"])
  take("encoder_norm/scale", "Transformer/encoder_norm/scale")
  take("encoder_norm/bias", "Transformer/encoder_norm/bias")

  # (the block's arrays by name relative to the block, how to name one in errors)
  blocks: list[tuple[dict, Any]] = []
  scanned = "Transformer/encoderblock/"
  if scanned + "LayerNorm_0/scale" in w:  # big_vision scan=True: every array [L, ...]
    stacked = {k[len(scanned):]: v for k, v in w.items() if k.startswith(scanned)}
    for i in range(stacked["LayerNorm_0/scale"].shape[0]):
      blocks.append(({k: v[i] for k, v in stacked.items()},
                     lambda n, i=i: f"{prefix}{scanned}{n}[{i}]"))
  else:
    while (b := f"Transformer/encoderblock_{len(blocks)}/") + "LayerNorm_0/scale" in w:
      blocks.append(({k[len(b):]: v for k, v in w.items() if k.startswith(b)},
                     lambda n, b=b: prefix + b + n))
  if not blocks:
    raise KeyError(f"{path}: no {prefix}Transformer/encoderblock_0 (nor a scanned "
                   f"{prefix}{scanned}); not a ViT npz")
  for i, (arr, label) in enumerate(blocks):
    at, block = f"encoderblock_{i}/", dict(arr=arr, label=label)
    take(at + "attention_norm/scale", "LayerNorm_0/scale", **block)
    take(at + "attention_norm/bias", "LayerNorm_0/bias", **block)
    take(at + "mlp_norm/scale", "LayerNorm_2/scale", "LayerNorm_1/scale", **block)
    take(at + "mlp_norm/bias", "LayerNorm_2/bias", "LayerNorm_1/bias", **block)
    for proj in ("query", "key", "value", "out"):
      for leaf in ("kernel", "bias"):
        take(f"{at}attention/{proj}/{leaf}", f"MultiHeadDotProductAttention_1/{proj}/{leaf}",
             f"MultiHeadDotProductAttention_0/{proj}/{leaf}", **block)
    for ours, theirs in (("dense_in", "Dense_0"), ("dense_out", "Dense_1")):
      for leaf in ("kernel", "bias"):
        take(f"{at}mlp/{ours}/{leaf}", f"MlpBlock_3/{theirs}/{leaf}",
             f"MlpBlock_0/{theirs}/{leaf}", **block)
  query = params["encoderblock_0/attention/query/kernel"]
  if query.ndim != 3:
    raise ValueError(f"{path}: {keys['encoderblock_0/attention/query/kernel']} has shape "
                     f"{query.shape}; a ViT's is [D, heads, D / heads]")
  return ViTWeights(str(path), params, keys, num_heads=query.shape[1],
                    heads_key=keys["encoderblock_0/attention/query/kernel"])


def read_hf(directory: str | pathlib.Path) -> ViTWeights:
  """A transformers ViTModel directory (config.json + model.safetensors)."""
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  d = pathlib.Path(directory)
  for name in ("config.json", "model.safetensors"):
    if not (d / name).is_file():
      raise FileNotFoundError(f"{d / name}: not found; a Hugging Face ViT directory holds "
                              f"config.json and model.safetensors. {DOWNLOAD}")
  config_path, weights_path = d / "config.json", d / "model.safetensors"
  cfg = json.loads(config_path.read_text())
  act = cfg.get("hidden_act", "gelu")
  if act not in _HF_GELUS:
    raise ValueError(f"{config_path}: hidden_act={act!r}; MBT's layers use GELU, so only "
                     f"weights trained with one of {_HF_GELUS} fit")
  if "num_attention_heads" not in cfg:
    raise KeyError(f"{config_path}: missing 'num_attention_heads'")
  heads = int(cfg["num_attention_heads"])
  tensors = {k.removeprefix("vit."): v for k, v in load_file(str(weights_path)).items()}
  params: dict[str, np.ndarray] = {}
  keys: dict[str, str] = {}

  def take(ours: str, name: str, convert=lambda x: x) -> None:
    if name not in tensors:
      raise KeyError(f"{weights_path}: no {name!r} (with or without 'vit.'); not a "
                     f"ViTModel checkpoint? Keys start {sorted(tensors)[:3]}")
    params[ours] = convert(np.asarray(tensors.pop(name), np.float32))
    keys[ours] = name

  take("patch_embedding/kernel", "embeddings.patch_embeddings.projection.weight",
       lambda w: w.transpose(2, 3, 1, 0))  # [D, 3, ph, pw] -> [ph, pw, 3, D]
  take("patch_embedding/bias", "embeddings.patch_embeddings.projection.bias")
  take("cls", "embeddings.cls_token")
  take("posembed/pos_embedding", "embeddings.position_embeddings", lambda p: p[0])
  take("encoder_norm/scale", "layernorm.weight")
  take("encoder_norm/bias", "layernorm.bias")
  width = params["patch_embedding/kernel"].shape[-1]
  if width % heads:
    raise ValueError(f"{config_path}: num_attention_heads={heads} does not divide the "
                     f"width {width} of embeddings.patch_embeddings.projection.weight")

  def split_heads(w):  # [out, in] -> [in, H, D/H]
    return w.T.reshape(w.shape[1], heads, -1)

  i = 0
  while f"encoder.layer.{i}.layernorm_before.weight" in tensors:
    hf, at = f"encoder.layer.{i}.", f"encoderblock_{i}/"
    take(at + "attention_norm/scale", hf + "layernorm_before.weight")
    take(at + "attention_norm/bias", hf + "layernorm_before.bias")
    take(at + "mlp_norm/scale", hf + "layernorm_after.weight")
    take(at + "mlp_norm/bias", hf + "layernorm_after.bias")
    for proj in ("query", "key", "value"):
      take(f"{at}attention/{proj}/kernel", f"{hf}attention.attention.{proj}.weight",
           split_heads)
      take(f"{at}attention/{proj}/bias", f"{hf}attention.attention.{proj}.bias",
           lambda b: b.reshape(heads, -1))
    take(at + "attention/out/kernel", hf + "attention.output.dense.weight",
         lambda w: w.T.reshape(heads, -1, w.shape[0]))
    take(at + "attention/out/bias", hf + "attention.output.dense.bias")
    take(at + "mlp/dense_in/kernel", hf + "intermediate.dense.weight", lambda w: w.T)
    take(at + "mlp/dense_in/bias", hf + "intermediate.dense.bias")
    take(at + "mlp/dense_out/kernel", hf + "output.dense.weight", lambda w: w.T)
    take(at + "mlp/dense_out/bias", hf + "output.dense.bias")
    i += 1
  if i == 0:
    raise KeyError(f"{weights_path}: no encoder.layer.0.layernorm_before.weight; not a "
                   "ViTModel checkpoint")
  unexpected = sorted(k for k in tensors if not k.startswith(_HF_UNUSED))
  if unexpected:
    raise ValueError(f"{weights_path}: {len(unexpected)} tensors do not map onto a ViT "
                     f"encoder ({i} layers read): {unexpected[:5]}")
  return ViTWeights(str(d), params, keys, num_heads=heads,
                    heads_key=f"num_attention_heads in {config_path}")


def read(path: str | pathlib.Path, fmt: str = "auto") -> ViTWeights:
  """`init_from_vit.path` / `.format` -> the checkpoint; a missing path says what to get."""
  p = pathlib.Path(path).expanduser()
  if fmt not in ("auto", "npz", "hf"):
    raise ValueError(f"init_from_vit.format must be auto, npz or hf, got {fmt!r}")
  if not p.exists():
    raise FileNotFoundError(f"init_from_vit.path={str(path)!r}: not found. {DOWNLOAD}")
  if fmt == "auto":
    fmt = "hf" if p.is_dir() else "npz"
  return read_hf(p) if fmt == "hf" else read_npz(p)


def _linear_weights(n_in: int, n_out: int) -> np.ndarray:
  """[n_out, n_in] linear interpolation, first and last positions kept (align corners)."""
  w = np.zeros((n_out, n_in))
  if n_in == 1:
    w[:, 0] = 1.0
    return w
  x = np.linspace(0.0, n_in - 1, n_out)
  lo = np.minimum(np.floor(x).astype(int), n_in - 2)
  frac = x - lo
  w[np.arange(n_out), lo] += 1.0 - frac
  w[np.arange(n_out), lo + 1] += frac
  return w


def resize_grid(pos: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
  """[gs * gs, D] positions of a square grid -> [gh * gw, D], bilinear, corners kept
  (scipy.ndimage.zoom(order=1) as MBT / ViViT / big_vision); unchanged grids are copied."""
  n, dim = pos.shape
  side = int(round(np.sqrt(n)))
  if side * side != n:
    raise ValueError(f"ViT position embeddings: {n} patch positions are not a square grid")
  gh, gw = grid
  if (gh, gw) == (side, side):
    return pos.copy()
  out = np.einsum("ah,bw,hwd->abd", _linear_weights(side, gh), _linear_weights(side, gw),
                  pos.reshape(side, side, dim).astype(np.float64))
  return out.reshape(gh * gw, dim).astype(pos.dtype)


def inflate(kernel: np.ndarray, t: int, how: str) -> np.ndarray:
  """[ph, pw, c, D] -> [t, ph, pw, c, D], `central_frame` or `average` (module docstring)."""
  if how == "central_frame":
    out = np.zeros((t,) + kernel.shape, kernel.dtype)
    out[t // 2] = kernel
    return out
  if how == "average":
    return np.repeat(kernel[None] / t, t, axis=0)
  raise ValueError(f"init_from_vit.rgb_init must be one of {RGB_INITS}, got {how!r}")


def tower_params(vit: ViTWeights, target: dict, *, modality: str, grid: tuple[int, ...],
                 rgb_init: str = "central_frame") -> dict:
  """A tower's params (`target`, e.g. fresh from init) with the ViT's weights in them.

  grid: the tower's token grid, (T / t, H / ph, W / pw) for rgb, (time / pt, mel / pf)
  for audio (`token_grids`).
  """
  flat = traverse_util.flatten_dict(target, sep="/")
  src, p, k = vit.source, vit.params, vit.keys
  kernel = flat["patch_embedding/kernel"]
  field = "config.model.video"
  width = p["patch_embedding/kernel"].shape[-1]
  if width != kernel.shape[-1]:
    raise ValueError(f"{src}: {k['patch_embedding/kernel']} has width {width} but the "
                     f"{modality} tower has {field}.hidden_size={kernel.shape[-1]}")
  depth = _count_blocks(flat)
  if vit.num_layers != depth:
    raise ValueError(f"{src}: {vit.num_layers} encoder blocks (last "
                     f"{k[f'encoderblock_{vit.num_layers - 1}/attention_norm/scale']}) but "
                     f"the {modality} tower has {field}.num_layers={depth}")
  heads = flat["encoderblock_0/attention/query/kernel"].shape[1]
  if vit.num_heads != heads:
    raise ValueError(f"{src}: {vit.heads_key} gives {vit.num_heads} attention heads but the "
                     f"{modality} tower has {field}.num_heads={heads}")
  patch = p["patch_embedding/kernel"].shape[:2]
  tower_patch = kernel.shape[1:3] if modality == "rgb" else kernel.shape[:2]
  if patch != tower_patch:
    name = "rgb_patch=(t, " if modality == "rgb" else "audio_patch=("
    raise ValueError(f"{src}: {k['patch_embedding/kernel']} has {patch[0]}x{patch[1]} "
                     f"patches but the {modality} tower's are {tower_patch[0]}x"
                     f"{tower_patch[1]}; set {field}.{name}{patch[0]}, {patch[1]})")
  tokens = flat["posembed/pos_embedding"].shape[0] - 1
  if int(np.prod(grid)) != tokens:
    raise ValueError(f"{modality} token grid {tuple(grid)} (from config.data) has "
                     f"{int(np.prod(grid))} positions but the tower has {tokens}")

  new = dict(p)
  pos = p["posembed/pos_embedding"]
  if modality == "rgb":
    new["patch_embedding/kernel"] = inflate(p["patch_embedding/kernel"], kernel.shape[0],
                                            rgb_init)
    frame = resize_grid(pos[1:], tuple(grid[1:]))
    new["posembed/pos_embedding"] = np.concatenate([pos[:1], np.tile(frame, (grid[0], 1))])
  elif modality == "audio":
    new["patch_embedding/kernel"] = p["patch_embedding/kernel"].sum(axis=2, keepdims=True)
    new["posembed/pos_embedding"] = np.concatenate([pos[:1], resize_grid(pos[1:], grid)])
  else:
    raise ValueError(f"modality must be rgb or audio, got {modality!r}")
  for path, value in new.items():
    if path not in flat:
      raise KeyError(f"{src}: {k[path]} has no place ({path}) in the {modality} tower")
    if tuple(flat[path].shape) != value.shape:
      raise ValueError(
          f"{src}: {k[path]} gives {path} the shape {value.shape} but the {modality} tower "
          f"has {tuple(flat[path].shape)}; {field} disagrees with the checkpoint "
          "(hidden_size, num_heads, mlp_dim)")
    flat[path] = np.asarray(value, flat[path].dtype)
  return traverse_util.unflatten_dict(flat, sep="/")


def token_grids(config) -> dict[str, tuple[int, ...]]:
  """Each tower's token grid from config.data and config.model.video."""
  d, v = config.data, config.model.video
  t, ph, pw = v.rgb_patch
  pt, pf = v.audio_patch
  frames = d.spec_segments * d.spec_segment_frames
  return {"rgb": (d.num_frames // t, d.image_size // ph, d.image_size // pw),
          "audio": (frames // pt, d.num_mel_bins // pf)}


def load_into_video(video: dict, video_cfg, config) -> tuple[str, dict] | None:
  """(checkpoint, `video` (MBT's params) with `video_cfg.init_from_vit` applied), or None
  when its path is unset: the ViT loader of `avtext.weights.pretrained`."""
  spec = video_cfg.get("init_from_vit")
  if not spec or not spec.get("path"):
    return None
  rgb_init = spec.get("rgb_init", "central_frame")
  if rgb_init not in RGB_INITS:
    raise ValueError(f"config.model.video.init_from_vit.rgb_init must be one of {RGB_INITS}, "
                     f"got {rgb_init!r}")
  towers = parse_modalities(spec.get("towers", "rgb+audio"))
  if "rgb" in towers and "rgb" in video and video_cfg.get("rgb_stem"):
    raise ValueError(
        f"config.model.video.init_from_vit loads ViT's linear patch embedding into the rgb "
        f"tower, but rgb_stem={tuple(video_cfg.rgb_stem)} puts a conv stem before it; set "
        f"rgb_stem=() or init_from_vit.towers=('audio',)")
  vit = read(spec.path, spec.get("format", "auto"))
  grids = token_grids(config)
  video = dict(video)
  for m in towers:
    if m not in video:
      logging.info("init_from_vit: the model has no %s tower; skipped", m)
      continue
    video[m] = tower_params(vit, video[m], modality=m, grid=grids[m], rgb_init=rgb_init)
    logging.info("video/%s initialised from %s (%s)", m, vit.source,
                 rgb_init if m == "rgb" else "kernel summed over RGB")
  return str(vit.source), video
