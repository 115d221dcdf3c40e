"""MBT: the audio-visual video encoder of VideoCC (§4.1, §5.2, app. C).

Multimodal Bottleneck Transformer (Nagrani et al., "Attention Bottlenecks for
Multimodal Fusion", 2021) as used by VideoCC: one ViT per modality (RGB
frames cut into tubelets, the log-mel spectrogram cut into patches like AST),
with separate weights, and `n_bottlenecks` shared fusion tokens from layer
`fusion_layer` upward. In a fusion layer each modality attends over
[its tokens ; bottleneck] with its own layer, and the bottleneck tokens the
modalities produce are averaged (MBT eq. 8-9). Cross-modal information passes
only through the bottleneck. The video embedding is the mean of the
modalities' [CLS] outputs (VideoCC §4.1, "Joint embedding").

Three options (`DemoOptions`), all off in the paper config and set by the demo config
variants, are for the synthetic demos, whose objects cover ~5 % of a 64x64 frame
(BENCHMARKS.md "Stage 1: a tower that sees shape"): `rgb_stem`, the hybrid ViT's
convolutional stem before the tubelets; `rgb_pool="max"`, the RGB tower's embedding as
the max over its output tokens instead of its [CLS]; `layer_scale`, CaiT's LayerScale on
every block (`LayerScaleBlock`).

Parameters:
  bottleneck            [1, n_bottlenecks, D]
  rgb | audio           one tower per modality:
    stem                rgb with rgb_stem only: layers.ConvStem, conv_<i> / norm_<i>
    patch_embedding     Conv, kernel [t, h, w, 3, D] (rgb), [h, w, 1, D] (audio);
                        rgb with an n-layer stem: [t, h / 2^n, w / 2^n, C_n, D]
    cls                 [1, 1, D]
    posembed            {pos_embedding [1 + N, D]}
    encoderblock_<i>    layers.EncoderBlock, pre-LN (with layer_scale: `LayerScaleBlock`,
                        also attention_scale / mlp_scale [D])
    encoder_norm        final LayerNorm
"""
import dataclasses
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from avtext.modalities import parse_modalities
from avtext.models import layers
from avtext.models import model_registry

Array = jax.Array

def _check_divisible(name: str, shape: Sequence[int],
                     patch: Sequence[int], axes: str) -> None:
  # A VALID conv would silently drop the remainder of the input.
  if any(s % p for s, p in zip(shape, patch)):
    raise ValueError(
        f"{name} input {axes} = {tuple(shape)} is not divisible by the patch "
        f"size {tuple(patch)}; crop or pad the input or change the patch size")


# ViT's layer (big_vision, scenic): tanh GELU, LayerNorm eps 1e-6.
ACTIVATION = "gelu_tanh"
LAYER_NORM_EPS = 1e-6
RGB_POOLS = ("cls", "max")  # config.model.video.rgb_pool: the RGB embedding's pooling


@dataclasses.dataclass(frozen=True)
class DemoOptions:
  """The synthetic demos' options (module docstring), off in the paper config.

  rgb_stem: channel widths of a convolutional stem before the RGB patch embedding
    (`layers.ConvStem`, the hybrid ViT); () is ViT's linear patch embedding (the paper).
    The token grid stays rgb_patch_size's, so each layer needs it divisible by 2.
  rgb_pool: what the RGB tower gives the embedding: "cls" (its [CLS] output, the
    paper) or "max" (the max over its final-LayerNorm patch tokens, channel by channel:
    a small object anywhere in the clip reaches the embedding without the [CLS]
    attention first learning where to look).
  layer_scale: 0 (ViT, the paper) or the initial value of CaiT's LayerScale on every
    residual branch (`LayerScaleBlock`).
  """
  rgb_stem: tuple[int, ...] = ()
  rgb_pool: str = "cls"
  layer_scale: float = 0.0

  def __post_init__(self):
    if self.rgb_pool not in RGB_POOLS:
      raise ValueError(f"rgb_pool must be {' or '.join(map(repr, RGB_POOLS))}, "
                       f"got {self.rgb_pool!r}")


class LayerScaleBlock(layers.EncoderBlock):
  """The shared layer with CaiT's LayerScale (Touvron et al. 2021, eq. 3): each residual
  branch times a learned per-channel vector `<branch>_scale` [D] that starts at
  `layer_scale`, so a stack starts near the identity."""
  layer_scale: float = 0.1

  def _rescale(self, name: str, y: Array) -> Array:
    scale = self.param(f"{name}_scale", nn.initializers.constant(self.layer_scale),
                       (y.shape[-1],), jnp.float32)
    return y * scale.astype(y.dtype)


def _block(module: nn.Module, index: int, **kwargs) -> layers.EncoderBlock:
  """Layer `index` of a tower (`module`: a `ModalityTower`)."""
  # Stochastic depth grows linearly with depth, 0 at the first layer (MBT).
  rate = module.dropout.stochastic_depth * index / max(module.num_layers - 1, 1)
  block = dict(num_heads=module.num_heads, mlp_dim=module.mlp_dim, pre_norm=True,
               activation=module.activation, layer_norm_eps=module.layer_norm_eps,
               dropout=dataclasses.replace(module.dropout, stochastic_depth=rate),
               compute=module.compute, **kwargs)
  if module.layer_scale:
    return LayerScaleBlock(**block, layer_scale=module.layer_scale)
  return layers.EncoderBlock(**block)


class ModalityTower(nn.Module):
  """One modality's ViT: tokenizer, [CLS], positions, layers, final norm.

  MBT calls `tokens`, `layer` and `final` separately because fusion layers
  interleave the towers. The final LayerNorm is per modality (scenic's MBT
  shares one), in keeping with VideoCC's separate weights per modality.
  """
  modality: str
  hidden_size: int
  num_layers: int
  num_heads: int
  mlp_dim: int
  patch_size: tuple[int, ...]
  activation: str = ACTIVATION
  layer_norm_eps: float = LAYER_NORM_EPS
  dropout: layers.Dropout = layers.Dropout()  # stochastic_depth: the last layer's
  compute: layers.Compute = layers.Compute()
  layer_scale: float = 0.0  # `DemoOptions`
  stem_features: Sequence[int] = ()  # `DemoOptions.rgb_stem`, for the RGB tower

  def setup(self):
    # Non-overlapping patches (ViT), tubelets for frames (MBT's 3D-conv stem); after a
    # conv stem, patches of its feature map that cover the same pixels (same token grid).
    dtype = self.compute.dtype
    embed = {"conv": nn.Conv, "matmul": layers.PatchMatmul}[self.compute.patch_embed]
    self.patch_embedding = embed(
        self.hidden_size, kernel_size=self._embed_patch(), strides=self._embed_patch(),
        padding="VALID", dtype=dtype)
    if self.stem_features:
      self.stem = layers.ConvStem(tuple(self.stem_features),
                                  layer_norm_eps=self.layer_norm_eps, dtype=dtype)
    self.cls = self.param("cls", nn.initializers.zeros,
                          (1, 1, self.hidden_size), jnp.float32)
    self.posembed = layers.AddPositionEmbedding()
    self.encoderblock = [_block(self, i) for i in range(self.num_layers)]
    self.encoder_norm = layers.LayerNorm(epsilon=self.layer_norm_eps, dtype=dtype)

  def _embed_patch(self) -> tuple[int, ...]:
    if not self.stem_features:
      return tuple(self.patch_size)
    t, h, w = self.patch_size
    n = len(self.stem_features)
    scale = 2 ** n
    if h % scale or w % scale:
      raise ValueError(f"rgb_patch {tuple(self.patch_size)}: a {n}-layer rgb_stem "
                       f"halves the frame {n} times, so the patch height and "
                       f"width must be multiples of {scale}")
    return (t, h // scale, w // scale)

  def tokens(self, x: Array) -> Array:
    """Raw input -> [B, 1 + N, D]: [CLS] then patch tokens, plus positions."""
    if self.modality == "rgb":
      if x.ndim != 5:
        raise ValueError(f"rgb input must be [B, T, H, W, C], got {x.shape}")
      _check_divisible("rgb", x.shape[1:4], self.patch_size, "(T, H, W)")
    else:
      if x.ndim != 3:
        raise ValueError(
            f"audio input must be a log-mel spectrogram [B, T, mel], got "
            f"{x.shape}")
      _check_divisible("audio", x.shape[1:3], self.patch_size, "(T, mel)")
      x = x[..., None]  # One-channel image (AST).
    x = x.astype(self.compute.dtype)
    if self.stem_features:
      x = self.stem(x)
    x = self.patch_embedding(x)
    x = x.reshape(x.shape[0], -1, x.shape[-1])  # Row-major over the grid.
    cls = jnp.broadcast_to(self.cls.astype(x.dtype),
                           (x.shape[0], 1, x.shape[2]))
    return self.posembed(jnp.concatenate([cls, x], axis=1))

  def layer(self, index: int, x: Array, deterministic: bool) -> Array:
    return self.encoderblock[index](x, deterministic=deterministic)

  def final(self, x: Array) -> Array:
    return self.encoder_norm(x)


class MBT(nn.Module):
  """Audio-visual bottleneck-fusion encoder; see the module docstring.

  Attributes:
    modalities: ('rgb',), ('audio',), ('rgb', 'audio'), or 'rgb', 'audio',
      'rgb+audio'. With one modality there is no fusion.
    hidden_size, num_layers, num_heads, mlp_dim: the ViT; defaults are ViT-B
      (VideoCC §5.2).
    rgb_patch_size: tubelet (t, h, w); (2, 16, 16) as MBT's 3D-conv stem.
    audio_patch_size: spectrogram patch (time, mel); 16 x 16 as AST/MBT.
    n_bottlenecks: B, fusion tokens (VideoCC §5.2: 4).
    fusion_layer: lf, first layer that fuses (VideoCC §5.2: 8); layers
      below it are unimodal; fusion_layer >= num_layers means no fusion.
    dropout: `layers.Dropout`, the rates (stochastic depth: the maximum, reached at the
      last layer). The layers are ViT's (tanh GELU, LayerNorm eps 1e-6).
    compute: dtype, remat, attention, scan_layers, patch_embed: see `layers.Compute`
      (scan_layers runs the unimodal layers of each tower as one `layers.scan_layers`
      and the fusion layers as another; same parameters; training with
      stochastic_depth > 0 needs the unscanned layers, whose rates differ).
    demo: `DemoOptions`, off in the paper config.
  """
  modalities: str | Sequence[str] = ("rgb", "audio")
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  mlp_dim: int = 3072
  rgb_patch_size: Sequence[int] = (2, 16, 16)
  audio_patch_size: Sequence[int] = (16, 16)
  n_bottlenecks: int = 4
  fusion_layer: int = 8
  dropout: layers.Dropout = layers.Dropout()
  compute: layers.Compute = layers.Compute()
  demo: DemoOptions = DemoOptions()

  @nn.compact
  def __call__(self, inputs: dict[str, Array], *,
               train: bool) -> dict[str, Any]:
    """Encodes a clip.

    Args:
      inputs: 'rgb' float [B, T, H, W, 3] and/or 'audio' log-mel float
        [B, T_audio, mel]; keys of unused modalities are ignored.
      train: enables dropout and stochastic depth (needs the 'dropout' rng).

    Returns:
      embedding: [B, D], mean of the modalities' [CLS] outputs (rgb_pool="max": the
        RGB tower's max over its patch tokens in place of its [CLS]).
      cls: {modality: [B, D]}, final-LayerNorm [CLS] outputs.
      tokens: {modality: [B, 1 + N_m, D]}, all final-LayerNorm outputs.
      bottleneck: [B, n_bottlenecks, D], the fused tokens after the last
        layer (only when the model fuses).
    """
    modalities = parse_modalities(self.modalities)
    if self.fusion_layer < 0:
      raise ValueError(f"fusion_layer must be >= 0, got {self.fusion_layer}")
    missing = [m for m in modalities if m not in inputs]
    if missing:
      raise KeyError(
          f"MBT(modalities={modalities}) needs inputs {missing}; got keys "
          f"{sorted(inputs)}")
    patch_sizes = {"rgb": tuple(self.rgb_patch_size),
                   "audio": tuple(self.audio_patch_size)}
    if len(patch_sizes["rgb"]) != 3 or len(patch_sizes["audio"]) != 2:
      raise ValueError(
          f"rgb_patch_size must be (t, h, w) and audio_patch_size (time, mel), "
          f"got {patch_sizes['rgb']} and {patch_sizes['audio']}")

    towers = {
        m: ModalityTower(
            modality=m,
            hidden_size=self.hidden_size,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            mlp_dim=self.mlp_dim,
            patch_size=patch_sizes[m],
            dropout=self.dropout,
            compute=self.compute,
            layer_scale=self.demo.layer_scale,
            stem_features=tuple(self.demo.rgb_stem) if m == "rgb" else (),
            name=m) for m in modalities
    }
    x = {m: towers[m].tokens(inputs[m]) for m in modalities}
    batch = x[modalities[0]].shape[0]

    fuses = len(modalities) > 1 and self.fusion_layer < self.num_layers
    bottleneck = None
    if fuses:
      bottleneck = self.param("bottleneck", nn.initializers.normal(0.02),
                              (1, self.n_bottlenecks, self.hidden_size),
                              jnp.float32)
      bottleneck = jnp.broadcast_to(
          bottleneck.astype(self.compute.dtype),
          (batch, self.n_bottlenecks, self.hidden_size))

    deterministic = not train
    first_fusion = self.fusion_layer if fuses else self.num_layers
    if self.compute.scan_layers and not self.is_initializing():
      x, bottleneck = self._scanned_layers(towers, x, bottleneck, modalities, first_fusion,
                                           deterministic)
    else:
      for i in range(self.num_layers):
        if i < first_fusion:
          x = {m: towers[m].layer(i, x[m], deterministic) for m in modalities}
        else:
          x, bottleneck = _fuse(
              x, bottleneck, lambda m, y: towers[m].layer(i, y, deterministic))

    tokens = {m: towers[m].final(x[m]) for m in modalities}
    cls = {m: tokens[m][:, 0] for m in modalities}
    pooled = dict(cls)
    if "rgb" in modalities and self.demo.rgb_pool == "max":
      pooled["rgb"] = jnp.max(tokens["rgb"][:, 1:], axis=1)  # [B, D]
    outputs = {
        "embedding": jnp.mean(jnp.stack([pooled[m] for m in modalities]), axis=0),
        "cls": cls,
        "tokens": tokens,
    }
    if fuses:
      outputs["bottleneck"] = bottleneck
    return outputs


  def _scanned_layers(self, towers, x, bottleneck, modalities, first_fusion, deterministic):
    """The layers as `layers.scan_layers`: each tower's unimodal layers, then the
    fusion layers (both towers and the bottleneck in one carry)."""
    if not deterministic and self.dropout.stochastic_depth > 0:
      raise ValueError(
          "config.model.video.scan_layers needs stochastic_depth = 0 in training: MBT's "
          "rate grows with depth, so its layers are not identical; unset scan_layers")
    params = self.variables["params"]
    block = _block(towers[modalities[0]], 0, parent=None)
    rng = layers.dropout_rng(self, deterministic, self.dropout.rate, self.dropout.attention)

    def apply(layer_params, y, key):
      return block.apply({"params": layer_params}, y, deterministic=deterministic,
                         rngs=None if key is None else {"dropout": key})

    def key_of(key, n):
      return None if key is None else jax.random.fold_in(key, n)

    for n, m in enumerate(modalities):
      x[m] = layers.scan_layers(
          params[m], [f"encoderblock_{i}" for i in range(first_fusion)],
          lambda y, p, key: apply(p, y, key), x[m], rng=key_of(rng, n))
    if first_fusion < self.num_layers:
      fusion = {f"layer_{i}": {m: params[m][f"encoderblock_{i}"] for m in modalities}
                for i in range(first_fusion, self.num_layers)}

      def step(carry, p, key):
        return _fuse(*carry, lambda m, y: apply(p[m], y, key_of(key, modalities.index(m))))

      x, bottleneck = layers.scan_layers(fusion, list(fusion), step, (x, bottleneck),
                                         rng=key_of(rng, len(modalities)))
    return x, bottleneck


def _fuse(x: dict[str, Array], bottleneck: Array, layer) -> tuple[dict[str, Array], Array]:
  """One fusion layer: `layer(m, [tokens ; bottleneck])` per modality m (MBT eq. 8),
  then the modalities' bottleneck copies averaged (eq. 9)."""
  x, updated = dict(x), []
  for m in x:
    n = x[m].shape[1]
    y = layer(m, jnp.concatenate([x[m], bottleneck], axis=1))
    x[m] = y[:, :n]
    updated.append(y[:, n:])
  return x, jnp.mean(jnp.stack(updated), axis=0)


@model_registry.register_model("mbt")
def mbt_from_config(cfg) -> MBT:
  """`config.model.video` (name="mbt") -> MBT; field names as in configs/videocc_avr.py."""
  return MBT(
      modalities=cfg.modalities, hidden_size=cfg.hidden_size, num_layers=cfg.num_layers,
      num_heads=cfg.num_heads, mlp_dim=cfg.mlp_dim,
      rgb_patch_size=tuple(cfg.rgb_patch), audio_patch_size=tuple(cfg.audio_patch),
      n_bottlenecks=cfg.n_bottlenecks, fusion_layer=cfg.fusion_layer,
      dropout=layers.Dropout(cfg.dropout_rate, cfg.attention_dropout_rate,
                             stochastic_depth=cfg.get("stochastic_depth", 0.0)),
      demo=DemoOptions(rgb_stem=tuple(cfg.get("rgb_stem") or ()),
                       rgb_pool=cfg.get("rgb_pool") or "cls",
                       layer_scale=cfg.get("layer_scale") or 0.0),
      compute=model_registry.compute_from_config(cfg))
