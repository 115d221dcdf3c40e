"""ResNet (He et al. 2016) v1.5 in flax, for images and spectrograms.

S-MiT (sec. 4) uses ResNet-152 as its image backbone and ResNet-34 / ResNet-50
with a 1-channel first convolution as spoken-caption models over 40-bin log-mel
spectrograms. `ResNet(depth, in_channels=...)` covers both; the layout is
torchvision's (v1.5: the stride of a bottleneck block sits on its 3x3 conv):

  stem: 7x7 conv stride 2 (no bias), BatchNorm, ReLU, 3x3 max-pool stride 2
  4 stages of BasicBlock (depth 18, 34) or Bottleneck (50, 101, 152) with
  widths width * (1, 2, 4, 8), the first block of stages 2-4 at stride 2 with a
  1x1 projection shortcut (+ BatchNorm) wherever the shape changes
  global average pool -> [B, C]; with `num_classes`, a linear classifier

Parameter counts equal torchvision's (ResNet-50 with 1000 classes: 25,557,032;
tests/test_models_resnet.py). BatchNorm statistics live in the "batch_stats"
collection: `train=True` uses batch statistics and updates the running ones
(apply with `mutable=["batch_stats"]`), `train=False` uses the running ones.
BatchNorm's momentum is 0.9 (torch's 0.1) and epsilon 1e-5 (flax updates the running
variance with the biased batch variance, torch with the unbiased one); the last BatchNorm
of each residual branch starts at scale 0 with `zero_init_residual` (off by
default, as torchvision's).

Input: [B, H, W, C] float (images NHWC; a spectrogram [B, time, mel, 1]).

Precision and memory (`config.model.dtype` / `.remat`, `avtext.models.layers.Compute`):
`dtype` is the computation dtype of every convolution and Dense; parameters and the
BatchNorm statistics (computed in float32 by flax, "batch_stats" kept float32) stay
float32, and the outputs ('features', 'embedding', 'logits') are float32. `remat`
rematerializes each residual block in the backward pass (`layers.remat`: parameter and
batch_stats names do not change; the running statistics are updated once, by the
forward pass).
"""
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from avtext.models import layers
from avtext.models import model_registry

DEPTHS = {18: ("basic", (2, 2, 2, 2)), 34: ("basic", (3, 4, 6, 3)),
          50: ("bottleneck", (3, 4, 6, 3)), 101: ("bottleneck", (3, 4, 23, 3)),
          152: ("bottleneck", (3, 8, 36, 3))}
_CONV_INIT = nn.initializers.variance_scaling(2.0, "fan_out", "normal")  # kaiming, fan_out


def _norm(train: bool, name: str, zero: bool = False, dtype: Any = jnp.float32
          ) -> nn.BatchNorm:
  # flax normalizes in float32 and keeps batch_stats float32; `dtype` is the output's.
  return nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5, name=name,
                      scale_init=nn.initializers.zeros if zero else nn.initializers.ones,
                      dtype=dtype)


class _Block(nn.Module):
  kind: str  # "basic" or "bottleneck"
  width: int
  stride: int
  zero_init_residual: bool = False
  dtype: Any = jnp.float32
  remat: str = "none"

  @nn.compact
  def __call__(self, x: jax.Array, train: bool) -> jax.Array:
    return layers.remat(_Block._body, self.remat, static_argnums=(2,))(self, x, train)

  def _body(self, x: jax.Array, train: bool) -> jax.Array:
    conv = lambda f, k, s, name: nn.Conv(f, (k, k), (s, s), padding=[(k // 2, k // 2)] * 2,
                                         use_bias=False, kernel_init=_CONV_INIT,
                                         dtype=self.dtype, name=name)
    norm = lambda name, zero=False: _norm(train, name, zero, self.dtype)
    if self.kind == "basic":
      out_ch = self.width
      y = nn.relu(norm("bn1")(conv(self.width, 3, self.stride, "conv1")(x)))
      y = norm("bn2", self.zero_init_residual)(conv(self.width, 3, 1, "conv2")(y))
    else:
      out_ch = 4 * self.width
      y = nn.relu(norm("bn1")(conv(self.width, 1, 1, "conv1")(x)))
      y = nn.relu(norm("bn2")(conv(self.width, 3, self.stride, "conv2")(y)))
      y = norm("bn3", self.zero_init_residual)(conv(out_ch, 1, 1, "conv3")(y))
    if self.stride != 1 or x.shape[-1] != out_ch:
      x = norm("downsample_bn")(conv(out_ch, 1, self.stride, "downsample")(x))
    return nn.relu(x + y)


class ResNet(nn.Module):
  """ResNet-`depth` (module docstring); returns {'embedding': [B, C], 'features': the last
  feature map [B, h, w, C][, 'logits': [B, num_classes]]}."""
  depth: int = 50
  width: int = 64
  in_channels: int = 3  # checked against the input: 1 for a spectrogram
  num_classes: int | None = None
  zero_init_residual: bool = False
  stage_sizes: Sequence[int] | None = None  # overrides DEPTHS[depth] (small demo nets)
  dtype: Any = jnp.float32  # computation dtype (module docstring)
  remat: str = "none"  # per residual block: "none", "full" or a jax.checkpoint_policies name

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool = False) -> dict[str, jax.Array]:
    if self.depth not in DEPTHS:
      raise ValueError(f"ResNet: depth must be one of {sorted(DEPTHS)}, got {self.depth}")
    if x.ndim != 4 or x.shape[-1] != self.in_channels:
      raise ValueError(f"ResNet: expected input [B, H, W, {self.in_channels}], got {x.shape}")
    kind, sizes = DEPTHS[self.depth]
    sizes = tuple(self.stage_sizes or sizes)
    x = nn.Conv(self.width, (7, 7), (2, 2), padding=[(3, 3), (3, 3)], use_bias=False,
                kernel_init=_CONV_INIT, dtype=self.dtype, name="conv1")(x)
    x = nn.relu(_norm(train, "bn1", dtype=self.dtype)(x))
    x = nn.max_pool(x, (3, 3), (2, 2), padding=[(1, 1), (1, 1)])
    for stage, blocks in enumerate(sizes):
      for b in range(blocks):
        x = _Block(kind, self.width * 2**stage, 2 if stage > 0 and b == 0 else 1,
                   self.zero_init_residual, dtype=self.dtype, remat=self.remat,
                   name=f"layer{stage + 1}_{b}")(x, train)
    x = x.astype(jnp.float32)
    out = {"features": x, "embedding": jnp.mean(x, axis=(1, 2))}
    if self.num_classes:
      out["logits"] = nn.Dense(self.num_classes, dtype=self.dtype, name="fc")(
          out["embedding"]).astype(jnp.float32)
    return out


@model_registry.register_model("resnet")
def resnet_from_config(cfg) -> ResNet:
  """config.model: depth (50), width (64), in_channels (3), num_classes (None),
  zero_init_residual (False), stage_sizes (None: the depth's); dtype, remat
  (`model_registry.compute_from_config`)."""
  compute = model_registry.compute_from_config(cfg)
  return ResNet(depth=cfg.get("depth", 50), width=cfg.get("width", 64),
                in_channels=cfg.get("in_channels", 3), num_classes=cfg.get("num_classes"),
                zero_init_residual=cfg.get("zero_init_residual", False),
                stage_sizes=tuple(cfg.stage_sizes) if cfg.get("stage_sizes") else None,
                dtype=compute.dtype, remat=compute.remat)


class _SpeechBlock(nn.Module):
  """ResDAVEnet's residual block: two width-`kernel` convolutions along time."""
  features: int
  stride: int
  kernel: int = 9
  dtype: Any = jnp.float32
  remat: str = "none"

  @nn.compact
  def __call__(self, x: jax.Array, train: bool) -> jax.Array:
    return layers.remat(_SpeechBlock._body, self.remat, static_argnums=(2,))(self, x, train)

  def _body(self, x: jax.Array, train: bool) -> jax.Array:
    pad = [(self.kernel // 2, self.kernel // 2)]
    conv = lambda s, name: nn.Conv(self.features, (self.kernel,), (s,), padding=pad,
                                   use_bias=False, kernel_init=_CONV_INIT, dtype=self.dtype,
                                   name=name)
    y = nn.relu(_norm(train, "bn1", dtype=self.dtype)(conv(self.stride, "conv1")(x)))
    y = _norm(train, "bn2", dtype=self.dtype)(conv(1, "conv2")(y))
    if self.stride != 1 or x.shape[-1] != self.features:
      x = _norm(train, "downsample_bn", dtype=self.dtype)(
          nn.Conv(self.features, (1,), (self.stride,), use_bias=False, kernel_init=_CONV_INIT,
                  dtype=self.dtype, name="downsample")(x))
    return nn.relu(x + y)


class ResDAVEnet(nn.Module):
  """ResDAVEnet (Harwath et al. 2020), the speech encoder S-MiT compares (sec. 4.2.2).

  Input [B, T, F] log-mel frames (F = 40): a BatchNorm over the raw input (one
  channel), a convolution spanning all F bins (F x 1, i.e. a linear map of each
  frame) to widths[0] channels + BatchNorm + ReLU, then 4 stages of `blocks` residual
  blocks of 1-D convolutions (kernel 9) along time, widths[1:] channels, stride 2 at
  each stage's first block (1x1 projection shortcut), as in the published model
  (widths 128, 128, 256, 512, 1024; 2 blocks a stage). Returns {'features': [B, T/16,
  C], 'embedding': the mean over the real frames, [B, C]}; `mask` [B, T] marks real
  frames (padding of a whole test caption). `dtype`, `remat`: as `ResNet`'s.
  """
  widths: Sequence[int] = (128, 128, 256, 512, 1024)
  blocks: Sequence[int] = (2, 2, 2, 2)
  kernel: int = 9
  dtype: Any = jnp.float32
  remat: str = "none"

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array | None = None, *, train: bool = False
               ) -> dict[str, jax.Array]:
    if x.ndim != 3:
      raise ValueError(f"ResDAVEnet: expected log-mel input [B, T, F], got {x.shape}")
    if len(self.widths) != len(self.blocks) + 1:
      raise ValueError(f"ResDAVEnet: widths needs one entry more than blocks, got "
                       f"{self.widths} and {self.blocks}")
    norm = lambda name: _norm(train, name, dtype=self.dtype)
    x = norm("input_bn")(x[..., None])[..., 0]
    x = nn.relu(norm("bn1")(nn.Dense(self.widths[0], use_bias=False, kernel_init=_CONV_INIT,
                                     dtype=self.dtype, name="conv1")(x)))
    for stage, (width, n) in enumerate(zip(self.widths[1:], self.blocks)):
      for b in range(n):
        x = _SpeechBlock(width, 2 if b == 0 else 1, self.kernel, dtype=self.dtype,
                         remat=self.remat, name=f"layer{stage + 1}_{b}")(x, train)
    x = x.astype(jnp.float32)
    if mask is None:
      pooled = x.mean(axis=1)
    else:  # a frame of the output covers 2^stages input frames; real if its first is
      step = 2 ** len(self.blocks)
      m = mask[:, ::step][:, :x.shape[1]].astype(x.dtype)
      pooled = jnp.einsum("bt,btc->bc", m, x) / jnp.maximum(m.sum(-1, keepdims=True), 1.0)
    return {"features": x, "embedding": pooled}


@model_registry.register_model("resdavenet")
def resdavenet_from_config(cfg) -> ResDAVEnet:
  """config.model: widths ((128, 128, 256, 512, 1024)), blocks ((2, 2, 2, 2)), kernel (9);
  dtype, remat (`model_registry.compute_from_config`)."""
  compute = model_registry.compute_from_config(cfg)
  return ResDAVEnet(widths=tuple(cfg.get("widths", (128, 128, 256, 512, 1024))),
                    blocks=tuple(cfg.get("blocks", (2, 2, 2, 2))), kernel=cfg.get("kernel", 9),
                    dtype=compute.dtype, remat=compute.remat)
