"""Start MBT's RGB and audio towers from 2D ViT weights (VideoCC §5.2: ImageNet-21k ViT-B/16).

Two on-disk layouts, read without torch or a hub:
  npz   the big_vision / scenic / vit_jax checkpoints (e.g. ViT-B_16.npz, the AugReg
        imagenet21k files): `embedding/kernel` [ph, pw, 3, D], `embedding/bias`, `cls`,
        `Transformer/posembed_input/pos_embedding` [1, 1 + N, D],
        `Transformer/encoderblock_{i}/{LayerNorm_0, MultiHeadDotProductAttention_1/
        {query,key,value,out}, LayerNorm_2, MlpBlock_3/Dense_{0,1}}`,
        `Transformer/encoder_norm` (big_vision's newer names LayerNorm_1,
        MultiHeadDotProductAttention_0, MlpBlock_0 and a top-level `pos_embedding` too)
  hf    a transformers `ViTModel` directory: config.json + model.safetensors
        (`[vit.]embeddings.patch_embeddings.projection.weight` [D, 3, ph, pw], ...)

Into a tower (`avtext.models.mbt.ModalityTower`) of the same width, depth and heads:
  rgb    the 2D patch kernel inflated to the (t, ph, pw) tubelet (MBT / ViViT):
         "central_frame" puts it on frame t // 2 and zeros elsewhere (ViViT's choice
         for its best models: the tower starts as a per-frame ViT on the centre frame);
         "average" puts kernel / t on every frame (a static video gives the 2D
         embedding). Position embeddings: the 2D grid resized (bilinear) to the tower's
         (H / ph, W / pw) grid and repeated over the T / t tubelets (ViViT's "tile").
  audio  the same ImageNet weights on the 1-channel log-mel (AST, MBT): the kernel
         summed over its 3 input channels ("sum", AST's choice; "mean" by config), the
         position grid resized to (frames / pt, mel / pf).
[CLS], the layers and the final norm copy over. The patch size must match (16 px in the
paper); a mismatch, or a width / depth / head count the checkpoint does not have, is an
error naming the file and the key.

config.model.video.init_from_vit (configs/videocc_avr.py): path, format ("auto": by the
path, a .npz file or a directory), rgb_init ("central_frame" | "average"), audio_kernel
("sum" | "mean"), towers (("rgb", "audio")).
"""
from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np

DOWNLOAD = ('ViT-B/16 ImageNet-21k weights: the npz from the big_vision / vit_jax release '
            '(gs://vit_models/imagenet21k/ViT-B_16.npz) or the Hugging Face directory '
            'google/vit-base-patch16-224-in21k (config.json + model.safetensors); put it on '
            'this machine and set --config.model.video.init_from_vit.path=<file or dir>')


def _flat(tree: dict, prefix: str = '') -> dict[str, np.ndarray]:
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict):
      out.update(_flat(v, f'{prefix}{k}/'))
    else:
      out[f'{prefix}{k}'] = np.asarray(v)
  return out


def _nest(flat: dict[str, np.ndarray]) -> dict:
  out: dict = {}
  for k, v in flat.items():
    node = out
    *parents, leaf = k.split('/')
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = v
  return out


def read_npz(path: str | pathlib.Path) -> dict[str, Any]:
  """The checkpoint in one layout: {'patch': [ph, pw, 3, D], 'patch_bias', 'cls' [D],
  'pos' [1 + N, D], 'layers': [{name: array}] in our EncoderBlock's names, 'norm'}."""
  path = pathlib.Path(path)
  with np.load(path) as f:
    w = {k: np.asarray(f[k]) for k in f.files}

  def get(*names):
    for n in names:
      if n in w:
        return w[n]
    raise KeyError(f'{path}: no {names[0]!r} (not a big_vision / scenic ViT npz?); '
                   f'keys start {sorted(w)[:6]}')

  pos = get('Transformer/posembed_input/pos_embedding', 'pos_embedding')
  out = {'patch': get('embedding/kernel'), 'patch_bias': get('embedding/bias'),
         'cls': get('cls').reshape(-1), 'pos': pos.reshape(pos.shape[-2], pos.shape[-1]),
         'norm': {'scale': get('Transformer/encoder_norm/scale'),
                  'bias': get('Transformer/encoder_norm/bias')}, 'layers': []}
  i = 0
  while f'Transformer/encoderblock_{i}/LayerNorm_0/scale' in w:
    b = f'Transformer/encoderblock_{i}/'
    att = next(b + a for a in ('MultiHeadDotProductAttention_1/',
                               'MultiHeadDotProductAttention_0/') if b + a + 'query/kernel' in w)
    ln2 = next(b + a for a in ('LayerNorm_2/', 'LayerNorm_1/') if b + a + 'scale' in w)
    mlp = next(b + a for a in ('MlpBlock_3/', 'MlpBlock_0/') if b + a + 'Dense_0/kernel' in w)
    layer = {'attention_norm/scale': get(b + 'LayerNorm_0/scale'),
             'attention_norm/bias': get(b + 'LayerNorm_0/bias'),
             'mlp_norm/scale': get(ln2 + 'scale'), 'mlp_norm/bias': get(ln2 + 'bias'),
             'mlp/dense_in/kernel': get(mlp + 'Dense_0/kernel'),
             'mlp/dense_in/bias': get(mlp + 'Dense_0/bias'),
             'mlp/dense_out/kernel': get(mlp + 'Dense_1/kernel'),
             'mlp/dense_out/bias': get(mlp + 'Dense_1/bias')}
    for n in ('query', 'key', 'value', 'out'):
      layer[f'attention/{n}/kernel'] = get(att + f'{n}/kernel')
      layer[f'attention/{n}/bias'] = get(att + f'{n}/bias')
    out['layers'].append(layer)
    i += 1
  if not out['layers']:
    raise KeyError(f'{path}: no Transformer/encoderblock_0; not a ViT npz')
  return out


def read_hf(directory: str | pathlib.Path) -> dict[str, Any]:
  """A transformers ViTModel directory in `read_npz`'s layout (Linear [out, in] -> [in,
  out]; q/k/v split into heads as our attention stores them)."""
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  d = pathlib.Path(directory)
  for name in ('config.json', 'model.safetensors'):
    if not (d / name).is_file():
      raise FileNotFoundError(f'{d / name}: not found; a HF ViT directory holds config.json '
                              f'and model.safetensors. {DOWNLOAD}')
  cfg = json.loads((d / 'config.json').read_text())
  raw = load_file(str(d / 'model.safetensors'))
  w = {k[4:] if k.startswith('vit.') else k: v for k, v in raw.items()}
  heads = int(cfg['num_attention_heads'])
  if cfg.get('hidden_act', 'gelu') != 'gelu':
    raise ValueError(f'{d}/config.json: hidden_act {cfg.get("hidden_act")!r}; MBT uses '
                     'exact gelu')

  def get(k):
    if k not in w:
      raise KeyError(f'{d}/model.safetensors: no {k!r} (not a ViTModel checkpoint?)')
    return np.asarray(w[k], np.float32)

  proj = get('embeddings.patch_embeddings.projection.weight')  # [D, 3, ph, pw]
  out = {'patch': proj.transpose(2, 3, 1, 0),
         'patch_bias': get('embeddings.patch_embeddings.projection.bias'),
         'cls': get('embeddings.cls_token').reshape(-1),
         'pos': get('embeddings.position_embeddings')[0],
         'norm': {'scale': get('layernorm.weight'), 'bias': get('layernorm.bias')},
         'layers': [], 'layer_norm_eps': float(cfg.get('layer_norm_eps', 1e-12))}
  i = 0
  while f'encoder.layer.{i}.layernorm_before.weight' in w:
    b = f'encoder.layer.{i}.'
    dim = get(b + 'attention.attention.query.weight').shape[0]
    dh = dim // heads
    layer = {'attention_norm/scale': get(b + 'layernorm_before.weight'),
             'attention_norm/bias': get(b + 'layernorm_before.bias'),
             'mlp_norm/scale': get(b + 'layernorm_after.weight'),
             'mlp_norm/bias': get(b + 'layernorm_after.bias'),
             'mlp/dense_in/kernel': get(b + 'intermediate.dense.weight').T,
             'mlp/dense_in/bias': get(b + 'intermediate.dense.bias'),
             'mlp/dense_out/kernel': get(b + 'output.dense.weight').T,
             'mlp/dense_out/bias': get(b + 'output.dense.bias'),
             'attention/out/kernel': get(b + 'attention.output.dense.weight').T.reshape(
                 heads, dh, dim),
             'attention/out/bias': get(b + 'attention.output.dense.bias')}
    for n in ('query', 'key', 'value'):
      layer[f'attention/{n}/kernel'] = get(b + f'attention.attention.{n}.weight').T.reshape(
          dim, heads, dh)
      layer[f'attention/{n}/bias'] = get(b + f'attention.attention.{n}.bias').reshape(heads, dh)
    out['layers'].append(layer)
    i += 1
  return out


def read(path: str | pathlib.Path, fmt: str = 'auto') -> dict[str, Any]:
  p = pathlib.Path(path).expanduser()
  if not p.exists():
    raise FileNotFoundError(f'init_from_vit.path={path}: not found. {DOWNLOAD}')
  if fmt == 'auto':
    fmt = 'hf' if p.is_dir() else 'npz'
  if fmt not in ('npz', 'hf'):
    raise ValueError(f'init_from_vit.format must be auto, npz or hf, got {fmt!r}')
  return read_hf(p) if fmt == 'hf' else read_npz(p)


def resize_grid(pos: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
  """[N, D] positions of a square grid -> [gh * gw, D], bilinear (half-pixel centres);
  the identity when the grid is unchanged."""
  n, dim = pos.shape
  side = int(round(np.sqrt(n)))
  if side * side != n:
    raise ValueError(f'ViT position embeddings: {n} patch positions are not a square grid')
  if (side, side) == tuple(grid):
    return pos.copy()
  import jax  # pylint: disable=g-import-not-at-top
  out = jax.image.resize(pos.reshape(side, side, dim), (grid[0], grid[1], dim), 'bilinear',
                         antialias=False)
  return np.asarray(out).reshape(grid[0] * grid[1], dim)


def inflate(kernel: np.ndarray, t: int, how: str) -> np.ndarray:
  """[ph, pw, c, D] -> [t, ph, pw, c, D] (module docstring)."""
  if how == 'central_frame':
    out = np.zeros((t,) + kernel.shape, kernel.dtype)
    out[t // 2] = kernel
    return out
  if how == 'average':
    return np.repeat(kernel[None] / t, t, axis=0)
  raise ValueError(f'init_from_vit.rgb_init must be central_frame or average, got {how!r}')


def tower_params(vit: dict[str, Any], target: dict, *, modality: str, grid: tuple[int, ...],
                 rgb_init: str = 'central_frame', audio_kernel: str = 'sum',
                 where: str = 'the ViT checkpoint') -> dict:
  """`target` (a tower's freshly initialised params) with the ViT's weights in it.
  grid: the tower's token grid, (nt, gh, gw) for rgb, (gt, gf) for audio."""
  flat = _flat(target)
  kernel = flat['patch_embedding/kernel']
  dim = kernel.shape[-1]
  if vit['patch'].shape[-1] != dim:
    raise ValueError(f'{where}: embedding/kernel width {vit["patch"].shape[-1]} but the '
                     f'{modality} tower has hidden_size {dim}')
  if len(vit['layers']) != sum(1 for k in flat if k.endswith('attention_norm/scale')):
    raise ValueError(f'{where}: {len(vit["layers"])} encoder blocks but the {modality} tower '
                     f'has {sum(1 for k in flat if k.endswith("attention_norm/scale"))}')
  if modality == 'rgb':
    t, ph, pw = kernel.shape[:3]
    if vit['patch'].shape[:2] != (ph, pw):
      raise ValueError(f'{where}: embedding/kernel patch {vit["patch"].shape[:2]} but the rgb '
                       f'tubelet is {(t, ph, pw)}; set config.model.video.rgb_patch=(t, '
                       f'{vit["patch"].shape[0]}, {vit["patch"].shape[1]})')
    new_kernel = inflate(vit['patch'], t, rgb_init)
    nt, gh, gw = grid
    pos = np.tile(resize_grid(vit['pos'][1:], (gh, gw)), (nt, 1))
  else:
    if vit['patch'].shape[:2] != kernel.shape[:2]:
      raise ValueError(f'{where}: embedding/kernel patch {vit["patch"].shape[:2]} but the '
                       f'audio patch is {kernel.shape[:2]}; set config.model.video.audio_patch')
    if audio_kernel not in ('sum', 'mean'):
      raise ValueError(f'init_from_vit.audio_kernel must be sum or mean, got {audio_kernel!r}')
    reduce = np.sum if audio_kernel == 'sum' else np.mean
    new_kernel = reduce(vit['patch'], axis=2, keepdims=True)
    pos = resize_grid(vit['pos'][1:], tuple(grid))
  new = {'patch_embedding/kernel': new_kernel, 'patch_embedding/bias': vit['patch_bias'],
         'cls': vit['cls'].reshape(1, 1, dim),
         'posembed/pos_embedding': np.concatenate([vit['pos'][:1], pos]),
         'encoder_norm/scale': vit['norm']['scale'], 'encoder_norm/bias': vit['norm']['bias']}
  for i, layer in enumerate(vit['layers']):
    new.update({f'encoderblock_{i}/{k}': v for k, v in layer.items()})
  for k, v in new.items():
    if k not in flat:
      raise KeyError(f'{where}: {k} has no place in the {modality} tower')
    if tuple(flat[k].shape) != tuple(v.shape):
      raise ValueError(f'{where}: {k} has shape {tuple(v.shape)} from the checkpoint but '
                       f'{tuple(flat[k].shape)} in the {modality} tower (config.model.video '
                       'disagrees with the checkpoint: hidden_size, num_heads, mlp_dim?)')
    flat[k] = np.asarray(v, flat[k].dtype)
  return _nest(flat)


def token_grids(config) -> dict[str, tuple[int, ...]]:
  """Each tower's token grid from config.data and config.model.video."""
  d, v = config.data, config.model.video
  t, ph, pw = v.rgb_patch
  pt, pf = v.audio_patch
  frames = d.spec_segments * d.spec_segment_frames
  return {'rgb': (d.num_frames // t, d.image_size // ph, d.image_size // pw),
          'audio': (frames // pt, d.num_mel_bins // pf)}


def load_into_video(params: dict, config) -> dict:
  """`params['video']` with `config.model.video.init_from_vit` applied (module docstring)."""
  spec = config.model.video.get('init_from_vit')
  if not spec or not spec.get('path'):
    return params
  vit = read(spec.path, spec.get('format', 'auto'))
  grids = token_grids(config)
  video = dict(params['video'])
  for m in spec.get('towers', ('rgb', 'audio')):
    if m not in video:
      continue  # a modality the model does not use
    video[m] = tower_params(vit, video[m], modality=m, grid=grids[m],
                            rgb_init=spec.get('rgb_init', 'central_frame'),
                            audio_kernel=spec.get('audio_kernel', 'sum'), where=str(spec.path))
  return {**params, 'video': video}
