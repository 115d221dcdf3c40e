"""ViT weights into MBT's towers: parity with transformers' FlaxViTModel, the npz layout,
inflation and position interpolation by hand."""
import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import transformers

from avtext.models import mbt
from avtext.weights import vit

D, HEADS, LAYERS, MLP, PATCH, IMAGE = 32, 4, 2, 64, 4, 16


def write_hf_vit(path, *, hidden=D, layers=LAYERS, heads=HEADS, mlp=MLP, image=IMAGE,
                 patch=PATCH, seed=0):
  """A random transformers ViTModel saved as the hub stores it: PyTorch names, Linear
  [out, in], conv [D, 3, ph, pw] (transformers' Flax save would keep Flax names)."""
  cfg = transformers.ViTConfig(hidden_size=hidden, num_hidden_layers=layers,
                               num_attention_heads=heads, intermediate_size=mlp,
                               image_size=image, patch_size=patch, layer_norm_eps=1e-6,
                               hidden_act='gelu')
  model = transformers.FlaxViTModel(cfg, seed=3, add_pooling_layer=False)
  # Random, not zero, biases and norms: every weight must land in the right place.
  rng = np.random.default_rng(seed)
  model.params = jax.tree.map(lambda x: np.asarray(rng.normal(0, 0.2, x.shape), np.float32),
                              model.params)
  model.config.to_json_file(path / 'config.json')
  pt = {}
  for key, value in flax.traverse_util.flatten_dict(model.params).items():
    name, leaf, v = '.'.join(key[:-1]), key[-1], np.asarray(value)
    if leaf == 'kernel':
      v = v.transpose(3, 2, 0, 1) if v.ndim == 4 else v.T
      leaf = 'weight'
    elif leaf == 'scale':
      leaf = 'weight'
    pt[f'{name}.{leaf}' if name else leaf] = np.ascontiguousarray(v)
  safetensors.numpy.save_file(pt, str(path / 'model.safetensors'))
  return model


@pytest.fixture(scope='module')
def hf_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp('vit')
  return path, write_hf_vit(path)


def _tower(t=1, eps=1e-6, modality='rgb', patch=None):
  return mbt.ModalityTower(modality=modality, hidden_size=D, num_layers=LAYERS,
                           num_heads=HEADS, mlp_dim=MLP,
                           patch_size=patch or ((t, PATCH, PATCH) if modality == 'rgb'
                                                else (PATCH, PATCH)),
                           activation='gelu', layer_norm_eps=eps, dropout_rate=0.0,
                           attention_dropout_rate=0.0, stochastic_depth=0.0,
                           dtype=jnp.float32)


def _forward(m, x):
  h = m.tokens(x)
  for i in range(LAYERS):
    h = m.layer(i, h, True)
  return m.final(h)


def _apply(tower, params, x):
  return np.asarray(flax.linen.apply(_forward, tower)({'params': params}, x))


def _init(tower, x):
  return jax.tree.map(np.asarray,
                      flax.linen.init(_forward, tower)(jax.random.PRNGKey(0), x)['params'])


def _hf_out(model, image):
  return np.asarray(model(jnp.asarray(image.transpose(0, 3, 1, 2))).last_hidden_state)


def test_hf_import_matches_flax_vit_model(hf_dir):
  path, model = hf_dir
  weights = vit.read(path)
  image = np.random.default_rng(1).normal(size=(2, IMAGE, IMAGE, 3)).astype(np.float32)
  tower = _tower(t=1)
  x = image[:, None]  # one frame, a (1, 4, 4) tubelet: no inflation
  params = vit.tower_params(weights, _init(tower, x), modality='rgb', grid=(1, 4, 4))
  np.testing.assert_allclose(_apply(tower, params, x), _hf_out(model, image), atol=1e-5,
                             rtol=1e-5)


def _to_npz(weights, path):
  """The same weights written in the vit_jax / scenic npz layout."""
  out = {'embedding/kernel': weights['patch'], 'embedding/bias': weights['patch_bias'],
         'cls': weights['cls'].reshape(1, 1, -1),
         'Transformer/posembed_input/pos_embedding': weights['pos'][None],
         'Transformer/encoder_norm/scale': weights['norm']['scale'],
         'Transformer/encoder_norm/bias': weights['norm']['bias']}
  names = {'attention_norm': 'LayerNorm_0', 'mlp_norm': 'LayerNorm_2',
           'attention': 'MultiHeadDotProductAttention_1', 'mlp/dense_in': 'MlpBlock_3/Dense_0',
           'mlp/dense_out': 'MlpBlock_3/Dense_1'}
  for i, layer in enumerate(weights['layers']):
    for k, v in layer.items():
      head, leaf = k.rsplit('/', 1)
      if head.startswith('attention/'):
        name = f'MultiHeadDotProductAttention_1/{head.split("/")[1]}'
      else:
        name = names[head]
      out[f'Transformer/encoderblock_{i}/{name}/{leaf}'] = v
  np.savez(path, **out)


def test_npz_layout_gives_the_same_params(hf_dir, tmp_path):
  path, _ = hf_dir
  weights = vit.read(path)
  _to_npz(weights, tmp_path / 'vit.npz')
  tower = _tower(t=2)
  x = np.zeros((1, 4, IMAGE, IMAGE, 3), np.float32)
  init = _init(tower, x)
  from_hf = vit.tower_params(weights, init, modality='rgb', grid=(2, 4, 4))
  from_npz = vit.tower_params(vit.read(tmp_path / 'vit.npz'), init, modality='rgb',
                              grid=(2, 4, 4))
  jax.tree.map(np.testing.assert_array_equal, from_hf, from_npz)


def test_inflation_by_hand(hf_dir):
  weights = vit.read(hf_dir[0])
  k = weights['patch']
  central = vit.inflate(k, 3, 'central_frame')
  assert central.shape == (3,) + k.shape
  np.testing.assert_array_equal(central[1], k)
  assert not central[0].any() and not central[2].any()
  avg = vit.inflate(k, 2, 'average')
  np.testing.assert_allclose(avg.sum(0), k, rtol=1e-6)
  # A static video through the average-inflated tubelet embeds as the image does.
  image = np.random.default_rng(2).normal(size=(1, IMAGE, IMAGE, 3)).astype(np.float32)
  tower2 = _tower(t=2)
  video = np.repeat(image[:, None], 2, axis=1)
  p2 = vit.tower_params(weights, _init(tower2, video), modality='rgb', grid=(1, 4, 4),
                        rgb_init='average')
  p1 = vit.tower_params(weights, _init(_tower(t=1), image[:, None]), modality='rgb',
                        grid=(1, 4, 4))
  np.testing.assert_allclose(_apply(tower2, p2, video), _apply(_tower(t=1), p1, image[:, None]),
                             atol=1e-5)
  # Audio: the kernel summed over its RGB channels.
  audio = _tower(modality='audio')
  spec = np.zeros((1, 8, 16), np.float32)
  pa = vit.tower_params(weights, _init(audio, spec), modality='audio', grid=(2, 4))
  np.testing.assert_allclose(pa['patch_embedding']['kernel'][..., 0, :], k.sum(axis=2),
                             rtol=1e-6)


def test_position_interpolation(hf_dir):
  pos = np.arange(2 * 2 * 1, dtype=np.float32).reshape(4, 1)  # grid [[0, 1], [2, 3]]
  np.testing.assert_array_equal(vit.resize_grid(pos, (2, 2)), pos)
  # 2x2 -> 4x4 bilinear with half-pixel centres: the first row goes 0, .25, .75, 1.
  up = vit.resize_grid(pos, (4, 4)).reshape(4, 4)
  np.testing.assert_allclose(up[0], [0, 0.25, 0.75, 1.0], atol=1e-6)
  np.testing.assert_allclose(up[:, 0], [0, 0.5, 1.5, 2.0], atol=1e-6)
  # In a tower: [CLS] kept, the grid repeated over the tubelets.
  weights = vit.read(hf_dir[0])
  tower = _tower(t=2)
  x = np.zeros((1, 4, 8, 8, 3), np.float32)  # 2 tubelets x 2 x 2 patches
  p = vit.tower_params(weights, _init(tower, x), modality='rgb', grid=(2, 2, 2))
  table = p['posembed']['pos_embedding']
  np.testing.assert_array_equal(table[0], weights['pos'][0])
  np.testing.assert_array_equal(table[1:5], table[5:9])
  np.testing.assert_allclose(table[1:5], vit.resize_grid(weights['pos'][1:], (2, 2)))


def test_mismatches_name_the_key(hf_dir, tmp_path):
  weights = vit.read(hf_dir[0])
  wrong_patch = _tower(patch=(2, 8, 8))
  x = np.zeros((1, 2, IMAGE, IMAGE, 3), np.float32)
  with pytest.raises(ValueError, match=r'embedding/kernel patch \(4, 4\).*rgb_patch'):
    vit.tower_params(weights, _init(wrong_patch, x), modality='rgb', grid=(1, 2, 2))
  wide = mbt.ModalityTower(modality='rgb', hidden_size=D, num_layers=LAYERS, num_heads=HEADS,
                           mlp_dim=2 * MLP, patch_size=(1, PATCH, PATCH), activation='gelu',
                           layer_norm_eps=1e-6, dropout_rate=0.0, attention_dropout_rate=0.0,
                           stochastic_depth=0.0, dtype=jnp.float32)
  x = np.zeros((1, 1, IMAGE, IMAGE, 3), np.float32)
  with pytest.raises(ValueError, match=r'encoderblock_0/mlp/dense_in/kernel has shape'):
    vit.tower_params(weights, _init(wide, x), modality='rgb', grid=(1, 4, 4))
  with pytest.raises(FileNotFoundError, match='ViT-B/16 ImageNet-21k'):
    vit.read(tmp_path / 'missing.npz')


def test_config_init_from_vit_reaches_the_task(tmp_path):
  """configs/videocc_avr.py's model.video.init_from_vit through RetrievalTask.load_pretrained."""
  from avtext.tasks import registry  # pylint: disable=g-import-not-at-top
  from tests.test_trainer import tiny_config  # pylint: disable=g-import-not-at-top
  config = tiny_config()
  v = config.model.video
  write_hf_vit(tmp_path, hidden=v.hidden_size, layers=v.num_layers, heads=v.num_heads,
               mlp=v.mlp_dim, image=config.data.image_size, patch=v.rgb_patch[1])
  v.init_from_vit.path = str(tmp_path)
  v.init_from_vit.rgb_init = 'average'
  v.init_from_vit.towers = ('rgb',)  # the tiny audio patch (8, 16) is not the ViT's 8 x 8
  task = registry.build_task(config)
  x = {'rgb': np.zeros((1, config.data.num_frames, 32, 32, 3), np.float32),
       'audio': np.zeros((1, config.data.spec_segments * config.data.spec_segment_frames,
                          config.data.num_mel_bins), np.float32)}
  batch = {**x, 'input_ids': np.zeros((1, 8), np.int32), 'attention_mask': np.ones((1, 8), np.int32)}
  params = jax.tree.map(np.asarray, task.init_variables(jax.random.PRNGKey(0), batch)['params'])
  loaded = task.load_pretrained(params)
  weights = vit.read(tmp_path)
  np.testing.assert_allclose(loaded['video']['rgb']['patch_embedding']['kernel'],
                             vit.inflate(weights['patch'], v.rgb_patch[0], 'average'))
  np.testing.assert_array_equal(loaded['video']['rgb']['encoderblock_1']['mlp']['dense_out']['bias'],
                                weights['layers'][1]['mlp/dense_out/bias'])
  jax.tree.map(np.testing.assert_array_equal, loaded['video']['audio'], params['video']['audio'])
  v.init_from_vit.towers = ('rgb', 'audio')
  with pytest.raises(ValueError, match=r'audio patch is \(8, 16\)'):
    registry.build_task(config).load_pretrained(params)
