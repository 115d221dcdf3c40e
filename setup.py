"""avtext: pip install -e .[dev]   (accelerators: .[tpu] or .[cuda12];
official PyTorch checkpoint import: .[convert])

Installs avtext, the configs and avworld, the demos' procedural world, which avtext
learns of only through the entry points below (`avtext.config_registry`: the group
`avtext.<kind>s` adds packages to that registry).

Exact pins live in requirements.lock (the known-good set for CPU machines);
`make test` / `make demo` install from it. install_requires names the direct
dependencies with the same pins so `pip install -e .` alone is reproducible.
The extras read their exact pins from requirements-dev.txt (tests),
requirements-tpu.txt (libtpu) and requirements-cuda12.txt (the CUDA 12 plugin
and its NVIDIA wheels), the files `make venv [ACCEL=...]` installs.
"""
import pathlib

import setuptools

_HERE = pathlib.Path(__file__).parent
_DIRECT = (
    "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "ml_collections",
    "clu", "grain", "tensorflow-cpu", "tensorboard", "tensorflow-datasets",
    "array_record", "h5py", "transformers", "tokenizers", "safetensors", "einops",
    "absl-py", "numpy", "scipy", "pillow", "importlib_resources", "pycocoevalcap",
    "sacrebleu", "starlette", "uvicorn",
)


def _pins(path):
  pins = {}
  for line in (_HERE / path).read_text().splitlines():
    line = line.split("#", 1)[0].strip()
    if "==" in line:
      name, version = (part.strip() for part in line.split("=="))
      key = name.split("[", 1)[0].lower().replace("_", "-")  # without [extras]
      pins[key] = f"{name}=={version}"
  return pins


_LOCK = _pins("requirements.lock")
_EXTRAS = {"dev": "requirements-dev.txt", "tpu": "requirements-tpu.txt",
           "cuda12": "requirements-cuda12.txt",
           # torch for avtext.import_checkpoint (official PyTorch checkpoints) only
           "convert": "requirements-convert.txt"}

setuptools.setup(
    name="avtext",
    version="0.1.0",
    description="Joint audio-visual-text representation learning in JAX/Flax",
    packages=setuptools.find_packages(
        include=["avtext", "avtext.*", "avworld", "avworld.*", "configs"]),
    python_requires=">=3.11",
    install_requires=[_LOCK[n.lower().replace("_", "-")] for n in _DIRECT],
    extras_require={extra: list(_pins(path).values()) for extra, path in _EXTRAS.items()},
    # The world's datasets (synthetic_clips, synthetic_smit) and the ground truth of the
    # files it writes (world.json formats), found by avtext's registries.
    entry_points={"avtext.datasets": ["avworld = avworld.datasets"],
                  "avtext.worlds": ["avworld = avworld"]},
)
