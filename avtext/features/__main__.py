"""`python -m avtext.features <kind> [flags]`: write feature files with a model.

Kinds (each has its own flags: python -m avtext.features <kind> --help):
  coot_text   COOT's text features of a dataset's meta file (BERT hidden states per
              token; avtext/features/coot_text.py)
  tvr_text    TVR's query and subtitle token features (avtext/features/tvr_text.py)
  smit        the smit_features directory of an S-MiT config: frozen per-frame and
              per-clip embeddings + captions (avtext/features/smit.py)
"""
import importlib
import sys

from avtext import cli

KINDS = ("coot_text", "tvr_text", "smit")


def main(argv=None) -> None:
  argv = list(sys.argv if argv is None else argv)
  program = "python -m avtext.features"
  if len(argv) < 2 or argv[1] in ("-h", "--help", "--helpshort", "--helpfull"):
    print(__doc__.strip())
    sys.exit(0 if len(argv) >= 2 else 2)
  kind = argv[1]
  if kind not in KINDS:
    cli.report(ValueError(f"unknown kind {kind!r}: expected one of {', '.join(KINDS)} "
                          f"(e.g. {program} coot_text --help)"), program)
    sys.exit(2)
  module = importlib.import_module(f"avtext.features.{kind}")
  cli.run(module.main, module.FLAGS, [f"{program} {kind}"] + argv[2:], doc=module.__doc__)


if __name__ == "__main__":
  main()
