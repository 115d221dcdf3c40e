"""ViT weights into MBT's towers (avtext/weights/vit.py).

Reference facts: transformers' FlaxViTModel on the same image (parity of the imported
tower), the vit_jax / big_vision npz layouts written from that model's own params,
scipy.ndimage.zoom(order=1) (what MBT / ViViT / big_vision resize position grids with) and
hand-computed inflations and interpolations.
"""
import pathlib
import sys

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import scipy.ndimage
import transformers

from avtext.models import layers
from avtext.models import mbt
from avtext.weights import vit

D, HEADS, LAYERS, MLP, PATCH, IMAGE = 32, 4, 2, 64, 4, 16
GRID = IMAGE // PATCH  # 4 x 4 patches


def reference_vit(*, hidden=D, layers=LAYERS, heads=HEADS, mlp=MLP, image=IMAGE, patch=PATCH,
                  seed=0):
  """A FlaxViTModel with random weights (biases and norms too: every weight must land in
  its place); tanh-GELU and eps 1e-6, the activation and LayerNorm MBT's towers use."""
  cfg = transformers.ViTConfig(hidden_size=hidden, num_hidden_layers=layers,
                               num_attention_heads=heads, intermediate_size=mlp,
                               image_size=image, patch_size=patch, layer_norm_eps=1e-6,
                               hidden_act="gelu_new")
  model = transformers.FlaxViTModel(cfg, add_pooling_layer=False, _do_init=False)
  shapes = jax.eval_shape(lambda rng: model.init_weights(rng, (1, image, image, 3)),
                          jax.random.PRNGKey(0))
  rng = np.random.default_rng(seed)
  params = jax.tree.map(lambda s: rng.normal(0, 0.2, s.shape).astype(np.float32), shapes)
  return model, flax.traverse_util.flatten_dict(params, sep="/")


def write_hf(path: pathlib.Path, model, params) -> pathlib.Path:
  """The model as the hub stores it: PyTorch names, Linear [out, in], conv [D, 3, ph, pw]."""
  model.config.to_json_file(path / "config.json")
  tensors = {}
  for key, v in params.items():
    name, leaf = key.rsplit("/", 1)
    if leaf == "kernel":
      v, leaf = (v.transpose(3, 2, 0, 1) if v.ndim == 4 else v.T), "weight"
    elif leaf == "scale":
      leaf = "weight"
    tensors[f"{name.replace('/', '.')}.{leaf}"] = np.ascontiguousarray(v)
  safetensors.numpy.save_file(tensors, str(path / "model.safetensors"))
  return path


def vit_jax_npz(params, heads=HEADS) -> dict[str, np.ndarray]:
  """The same weights in the vit_jax / scenic layout (ViT-B_16.npz's key names)."""
  p = params
  out = {"embedding/kernel": p["embeddings/patch_embeddings/projection/kernel"],
         "embedding/bias": p["embeddings/patch_embeddings/projection/bias"],
         "cls": p["embeddings/cls_token"],
         "Transformer/posembed_input/pos_embedding": p["embeddings/position_embeddings"],
         "Transformer/encoder_norm/scale": p["layernorm/scale"],
         "Transformer/encoder_norm/bias": p["layernorm/bias"],
         "head/kernel": np.zeros((D, 5), np.float32)}
  i = 0
  while f"encoder/layer/{i}/layernorm_before/scale" in p:
    hf, bv = f"encoder/layer/{i}/", f"Transformer/encoderblock_{i}/"
    for ours, theirs in (("LayerNorm_0", "layernorm_before"), ("LayerNorm_2", "layernorm_after")):
      out[f"{bv}{ours}/scale"] = p[f"{hf}{theirs}/scale"]
      out[f"{bv}{ours}/bias"] = p[f"{hf}{theirs}/bias"]
    for proj in ("query", "key", "value"):
      w = p[f"{hf}attention/attention/{proj}/kernel"]
      out[f"{bv}MultiHeadDotProductAttention_1/{proj}/kernel"] = w.reshape(D, heads, -1)
      out[f"{bv}MultiHeadDotProductAttention_1/{proj}/bias"] = (
          p[f"{hf}attention/attention/{proj}/bias"].reshape(heads, -1))
    out[f"{bv}MultiHeadDotProductAttention_1/out/kernel"] = (
        p[f"{hf}attention/output/dense/kernel"].reshape(heads, -1, D))
    out[f"{bv}MultiHeadDotProductAttention_1/out/bias"] = p[f"{hf}attention/output/dense/bias"]
    for dense, theirs in (("Dense_0", "intermediate/dense"), ("Dense_1", "output/dense")):
      out[f"{bv}MlpBlock_3/{dense}/kernel"] = p[f"{hf}{theirs}/kernel"]
      out[f"{bv}MlpBlock_3/{dense}/bias"] = p[f"{hf}{theirs}/bias"]
    i += 1
  return out


def big_vision_npz(params) -> dict[str, np.ndarray]:
  """big_vision's newer layout: _0 / LayerNorm_1 / MlpBlock_0 names, scanned layers
  [L, ...], a top-level pos_embedding over the patches only (added before the [CLS] is
  prepended, so the [CLS] carries its old position), under a params/ prefix."""
  old = vit_jax_npz(params)
  rename = {"MultiHeadDotProductAttention_1": "MultiHeadDotProductAttention_0",
            "LayerNorm_2": "LayerNorm_1", "MlpBlock_3": "MlpBlock_0"}
  out, stacked = {}, {}
  for k, v in old.items():
    if k.startswith("Transformer/encoderblock_"):
      _, block, *rest = k.split("/")
      rest[0] = rename.get(rest[0], rest[0])
      stacked.setdefault("/".join(rest), []).append((int(block.split("_")[1]), v))
    elif k != "Transformer/posembed_input/pos_embedding":
      out[k] = v
  for k, vs in stacked.items():
    out[f"Transformer/encoderblock/{k}"] = np.stack([v for _, v in sorted(vs)])
  pos = old["Transformer/posembed_input/pos_embedding"]
  out["pos_embedding"] = pos[:, 1:]
  out["cls"] = old["cls"] + pos[:, :1]
  return {f"params/{k}": v for k, v in out.items()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  model, params = reference_vit()
  return model, params, write_hf(tmp_path_factory.mktemp("hf_vit"), model, params)


def tower(modality="rgb", t=1, patch=None, **kw):
  """MBT's tower as `mbt.MBT` builds it (tanh-GELU, eps 1e-6) at the reference's sizes."""
  size = dict(hidden_size=D, num_layers=LAYERS, num_heads=HEADS, mlp_dim=MLP)
  size.update(kw)
  return mbt.ModalityTower(
      modality=modality, **size,
      patch_size=patch or ((t, PATCH, PATCH) if modality == "rgb" else (PATCH, PATCH)),
      activation="gelu_tanh", layer_norm_eps=1e-6, dropout=layers.Dropout(0.0),
      compute=layers.Compute(dtype=jnp.float32))


def _stages(m, x):
  """(tokens after embedding, pre-norm tokens after the last layer, final-norm tokens)."""
  h0 = h = m.tokens(x)
  for i in range(m.num_layers):
    h = m.layer(i, h, True)
  return h0, h, m.final(h)


def run(m, params, x):
  return [np.asarray(a) for a in flax.linen.apply(_stages, m)({"params": params}, x)]


def init(m, x, shapes_only=False):
  fn = lambda: flax.linen.init(_stages, m)(jax.random.PRNGKey(0), x)["params"]
  return jax.eval_shape(fn) if shapes_only else jax.tree.map(np.asarray, fn())


IMAGE_IN = np.random.default_rng(1).normal(size=(2, IMAGE, IMAGE, 3)).astype(np.float32)


def hf_stages(model, params, image):
  """FlaxViTModel's embeddings, last pre-norm hidden state and last_hidden_state."""
  out = model(jnp.asarray(image.transpose(0, 3, 1, 2)),
              params=flax.traverse_util.unflatten_dict(params, sep="/"),
              output_hidden_states=True)
  return [np.asarray(a) for a in (out.hidden_states[0], out.hidden_states[-1],
                                  out.last_hidden_state)]


def test_hf_import_matches_flax_vit_model(reference):
  """One frame in a (1, 4, 4) tubelet: no inflation, the 4 x 4 grid unchanged, so every
  stage equals FlaxViTModel's: hidden_states[0] ([CLS] + patches + positions),
  hidden_states[-1] (after the last layer, before the final LayerNorm) and
  last_hidden_state (after it), all 1 + 16 tokens."""
  model, params, hf_dir = reference
  m = tower(t=1)
  x = IMAGE_IN[:, None]
  p = vit.tower_params(vit.read(hf_dir), init(m, x), modality="rgb", grid=(1, GRID, GRID))
  ours, theirs = run(m, p, x), hf_stages(model, params, IMAGE_IN)
  for a, b in zip(ours, theirs):
    assert a.shape == b.shape == (2, 1 + GRID * GRID, D)
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def test_npz_layouts_give_the_hf_params(reference, tmp_path):
  model, params, hf_dir = reference
  m = tower(t=2)
  x = np.zeros((1, 2, IMAGE, IMAGE, 3), np.float32)
  target = init(m, x)
  from_hf = vit.tower_params(vit.read(hf_dir), target, modality="rgb", grid=(1, GRID, GRID))
  np.savez(tmp_path / "ViT-B_16.npz", **vit_jax_npz(params))
  from_npz = vit.tower_params(vit.read(tmp_path / "ViT-B_16.npz"), target, modality="rgb",
                              grid=(1, GRID, GRID))
  jax.tree.map(np.testing.assert_array_equal, from_npz, from_hf)
  # big_vision's layout is the same function with the [CLS]'s position inside cls.
  np.savez(tmp_path / "bv.npz", **big_vision_npz(params))
  bv = vit.read(tmp_path / "bv.npz", "npz")
  assert not bv.params["posembed/pos_embedding"][0].any()
  m1 = tower(t=1)
  p = vit.tower_params(bv, init(m1, IMAGE_IN[:, None]), modality="rgb", grid=(1, GRID, GRID))
  for a, b in zip(run(m1, p, IMAGE_IN[:, None]), hf_stages(model, params, IMAGE_IN)):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def test_inflation_by_hand(reference):
  weights = vit.read(reference[2])
  k = weights.params["patch_embedding/kernel"]
  for t in (2, 3):  # the centre frame is t // 2: 1 for both
    central = vit.inflate(k, t, "central_frame")
    assert central.shape == (t,) + k.shape
    np.testing.assert_array_equal(central[1], k)
    assert not np.delete(central, 1, axis=0).any()
    np.testing.assert_array_equal(vit.inflate(k, t, "average"), np.stack([k / t] * t))
  with pytest.raises(ValueError, match="rgb_init"):
    vit.inflate(k, 2, "mean")

  m1, image = tower(t=1), IMAGE_IN[:, None]
  p1 = vit.tower_params(weights, init(m1, image), modality="rgb", grid=(1, GRID, GRID))
  want = run(m1, p1, image)[0]  # the image's tokens
  m3 = tower(t=3)
  target = init(m3, np.zeros((1, 3, IMAGE, IMAGE, 3), np.float32))
  # average: a static 3-frame clip embeds exactly as its image.
  video = np.repeat(image, 3, axis=1)
  avg = vit.tower_params(weights, target, modality="rgb", grid=(1, GRID, GRID),
                         rgb_init="average")
  np.testing.assert_allclose(run(m3, avg, video)[0], want, atol=1e-5)
  # central_frame: only frame 1 counts; frames 0 and 2 are noise.
  noisy = video.copy()
  noisy[:, [0, 2]] = np.random.default_rng(3).normal(size=noisy[:, [0, 2]].shape)
  central = vit.tower_params(weights, target, modality="rgb", grid=(1, GRID, GRID))
  np.testing.assert_allclose(run(m3, central, noisy)[0], want, atol=1e-5)


def test_audio_tower_is_the_image_model_on_the_repeated_spectrogram(reference):
  """MBT feeds the log-mel repeated on 3 channels to the RGB kernel; the 1-channel tower
  with the summed kernel is that model (here on a 16 x 16 spectrogram: the same grid)."""
  model, params, hf_dir = reference
  weights = vit.read(hf_dir)
  spec = np.random.default_rng(4).normal(size=(2, IMAGE, IMAGE)).astype(np.float32)
  m = tower("audio")
  p = vit.tower_params(weights, init(m, spec), modality="audio", grid=(GRID, GRID))
  np.testing.assert_allclose(p["patch_embedding"]["kernel"][..., 0, :],
                             weights.params["patch_embedding/kernel"].sum(axis=2), rtol=1e-6)
  image = np.repeat(spec[..., None], 3, axis=-1)
  for a, b in zip(run(m, p, spec), hf_stages(model, params, image)):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def test_position_interpolation():
  pos = np.arange(4, dtype=np.float32).reshape(4, 1)  # the 2 x 2 grid [[0, 1], [2, 3]]
  np.testing.assert_array_equal(vit.resize_grid(pos, (2, 2)), pos)
  big = np.random.default_rng(5).normal(size=(14 * 14, 3)).astype(np.float32)
  np.testing.assert_array_equal(vit.resize_grid(big, (14, 14)), big)  # ViT-B/16 at 224
  # Corners kept: 2 -> 3 puts the mean of each pair between them.
  np.testing.assert_allclose(vit.resize_grid(pos, (3, 3)).reshape(3, 3),
                             [[0, 0.5, 1], [1, 1.5, 2], [2, 2.5, 3]], atol=1e-6)
  np.testing.assert_allclose(vit.resize_grid(pos, (4, 2)).reshape(4, 2),
                             [[0, 1], [2 / 3, 5 / 3], [4 / 3, 7 / 3], [2, 3]], atol=1e-6)
  # As MBT resizes: scipy.ndimage.zoom(order=1), e.g. ViT-B/16's 14 x 14 to the paper's
  # 800 x 128 spectrogram in 16 x 16 patches, 50 x 8.
  zoom = scipy.ndimage.zoom(big.reshape(14, 14, 3), (50 / 14, 8 / 14, 1), order=1)
  np.testing.assert_allclose(vit.resize_grid(big, (50, 8)), zoom.reshape(400, 3), atol=1e-5)


def test_positions_in_the_towers(reference):
  """[CLS]'s position kept; rgb: the resized frame grid repeated for each tubelet time."""
  weights = vit.read(reference[2])
  pos = weights.params["posembed/pos_embedding"]
  m = tower(t=2)
  x = np.zeros((1, 4, 8, 8, 3), np.float32)  # 2 tubelet times x 2 x 2 patches
  table = vit.tower_params(weights, init(m, x), modality="rgb",
                           grid=(2, 2, 2))["posembed"]["pos_embedding"]
  np.testing.assert_array_equal(table[0], pos[0])
  frame = vit.resize_grid(pos[1:], (2, 2))
  np.testing.assert_array_equal(table[1:], np.concatenate([frame, frame]))
  # 4 x 4 -> 2 x 2 with corners kept is the grid's 4 corners.
  np.testing.assert_allclose(frame, pos[1:].reshape(4, 4, D)[::3, ::3].reshape(4, D),
                             rtol=1e-6)
  audio = tower("audio")
  spec = np.zeros((1, 8, 16), np.float32)
  table = vit.tower_params(weights, init(audio, spec), modality="audio",
                           grid=(2, 4))["posembed"]["pos_embedding"]
  np.testing.assert_array_equal(table[0], pos[0])
  np.testing.assert_allclose(table[1:], vit.resize_grid(pos[1:], (2, 4)))


def test_mismatches_name_the_key_and_the_config_field(reference, tmp_path):
  weights = vit.read(reference[2])
  hf = str(reference[2])
  x = np.zeros((1, 2, IMAGE, IMAGE, 3), np.float32)

  def load(m, grid=(1, GRID, GRID)):
    return vit.tower_params(weights, init(m, x, shapes_only=True), modality="rgb", grid=grid)

  cases = [
      (dict(patch=(2, 8, 8)), (1, 2, 2),
       r"embeddings.patch_embeddings.projection.weight has 4x4 patches .*video."
       r"rgb_patch=\(t, 4, 4\)"),
      (dict(hidden_size=2 * D), None,
       r"embeddings.patch_embeddings.projection.weight has width 32 .*hidden_size=64"),
      (dict(num_layers=3), None,
       r"2 encoder blocks \(last encoder.layer.1.layernorm_before.weight\) .*num_layers=3"),
      (dict(num_heads=2), None,
       r"num_attention_heads in .*config.json gives 4 attention heads .*num_heads=2"),
      (dict(mlp_dim=2 * MLP), None,
       r"encoder.layer.0.intermediate.dense.weight gives encoderblock_0/mlp/dense_in/kernel "
       r"the shape \(32, 64\) but the rgb tower has \(32, 128\)"),
  ]
  for kw, grid, message in cases:
    with pytest.raises(ValueError, match=message) as e:
      load(tower(t=2, **kw), grid or (1, GRID, GRID))
    assert str(e.value).startswith(hf)
  with pytest.raises(ValueError, match=r"token grid \(1, 2, 2\) .* 4 positions .* has 16"):
    load(tower(t=2), (1, 2, 2))

  npz = vit_jax_npz(reference[1])
  del npz["Transformer/encoderblock_1/MlpBlock_3/Dense_1/bias"]
  np.savez(tmp_path / "broken.npz", **npz)
  with pytest.raises(KeyError, match=r"broken.npz: no 'Transformer/encoderblock_1/MlpBlock_3/"
                     r"Dense_1/bias'"):
    vit.read(tmp_path / "broken.npz")
  with pytest.raises(FileNotFoundError, match="ViT-B/16 ImageNet-21k") as e:
    vit.read(tmp_path / "missing.npz")
  assert vit.DEFAULT_PATH in str(e.value) and "vit-base-patch16-224-in21k" in str(e.value)


def test_config_init_from_vit_reaches_the_task(tmp_path):
  """configs/videocc_avr.py's model.video.init_from_vit through AVRTask.load_pretrained."""
  from avtext.tasks import task_registry  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
  from configs import videocc_avr  # pylint: disable=g-import-not-at-top
  paper = videocc_avr.get_config()
  assert paper.model.video.init_from_vit.path == vit.DEFAULT_PATH
  # 32 frames of 224 px in 2 x 16 x 16 tubelets; 800 x 128 log-mel in 16 x 16 patches.
  assert vit.token_grids(paper) == {"rgb": (16, 14, 14), "audio": (50, 8)}
  assert videocc_avr.get_config("demo").model.video.init_from_vit.path is None
  config = videocc_avr.get_config("tiny")
  v, d = config.model.video, config.data
  model, params = reference_vit(hidden=v.hidden_size, layers=v.num_layers, heads=v.num_heads,
                                mlp=v.mlp_dim, image=d.image_size, patch=v.rgb_patch[1])
  write_hf(tmp_path, model, params)
  batch = {"rgb": np.zeros((1, d.num_frames, d.image_size, d.image_size, 3), np.float32),
           "audio": np.zeros((1, d.spec_segments * d.spec_segment_frames, d.num_mel_bins),
                             np.float32),
           "input_ids": np.zeros((1, 8), np.int32),
           "attention_mask": np.ones((1, 8), np.int32)}
  task = task_registry.build_task(config)
  shapes = jax.eval_shape(task.init_variables, jax.random.PRNGKey(0), batch)["params"]
  fresh = jax.tree.map(lambda s: np.full(s.shape, 7, s.dtype), shapes)
  assert task.load_pretrained(fresh) is fresh  # path None: nothing read

  v.init_from_vit.path = str(tmp_path)
  v.init_from_vit.rgb_init = "average"
  v.init_from_vit.towers = ("rgb",)  # the tiny audio patch (8, 16) is not the ViT's 8 x 8
  loaded = task_registry.build_task(config).load_pretrained(fresh)
  rgb = loaded["video"]["rgb"]
  np.testing.assert_allclose(rgb["patch_embedding"]["kernel"],
                             np.stack([params["embeddings/patch_embeddings/projection/kernel"]
                                       / v.rgb_patch[0]] * v.rgb_patch[0]), rtol=1e-6)
  np.testing.assert_array_equal(rgb["encoderblock_1"]["mlp"]["dense_out"]["bias"],
                                params["encoder/layer/1/output/dense/bias"])
  assert rgb["posembed"]["pos_embedding"].shape == (1 + 2 * 4 * 4, v.hidden_size)
  jax.tree.map(np.testing.assert_array_equal, loaded["video"]["audio"], fresh["video"]["audio"])
  jax.tree.map(np.testing.assert_array_equal, loaded["text"], fresh["text"])

  v.init_from_vit.towers = ("rgb", "audio")
  with pytest.raises(ValueError, match=r"audio tower's are 8x16; set config.model.video."
                     r"audio_patch=\(8, 8\)"):
    task_registry.build_task(config).load_pretrained(fresh)
  v.init_from_vit.towers = ("rgb",)
  v.rgb_stem = (4,)  # a conv stem has no counterpart in the ViT checkpoint
  with pytest.raises(ValueError, match=r"rgb_stem=\(4,\) puts a conv stem before it"):
    task_registry.build_task(config).load_pretrained(fresh)
  v.rgb_stem = ()
  v.init_from_vit.path = str(tmp_path / "ViT-B_16.npz")
  with pytest.raises(FileNotFoundError, match="init_from_vit.path=.*ViT-B_16.npz.*not found"):
    task_registry.build_task(config).load_pretrained(fresh)
