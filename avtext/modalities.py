"""The video modalities a clip can feed a model: the one list data and models share."""
from typing import Sequence

MODALITIES = ("rgb", "audio")


def parse_modalities(modalities: str | Sequence[str]) -> tuple[str, ...]:
  """'rgb', 'audio', 'rgb+audio' or a sequence of those names -> tuple, in that order."""
  parsed = tuple(modalities.split("+") if isinstance(modalities, str) else modalities)
  if not parsed or len(set(parsed)) != len(parsed) or set(parsed) - set(MODALITIES):
    raise ValueError(f"modalities must be a non-empty, duplicate-free subset of {MODALITIES} "
                     f"(or 'rgb', 'audio', 'rgb+audio'), got {modalities!r}")
  return parsed
