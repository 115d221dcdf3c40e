r"""See what a model finds: a local web page to search your videos and a moment corpus,
watch the hits and caption a clip, and read a run's curves, metrics and config.

    python -m avtext.serve --index=~/my_videos.index [--index=OTHER ...] \
        [--caption_workdir=workdirs/demo/caption] \
        [--moments_workdir=workdirs/demo/xml --moments_step=best --corpus=DIR \
         --moment_videos=DIR] [--host=127.0.0.1] [--port=8000]

Serves what avtext writes: own-video indexes (`avtext.index --out`), searched with their
run (loaded once: `--workdir` / `--step`, default the first index's; an index of another
run is listed with its reason and cannot be searched), a captioning run
(`avtext.caption`'s) and a stored moment corpus with its XML run
(`avtext.search_moments`'); `--moment_videos` holds the corpus' videos as
<vid_name>.<ext>, to play its moments. Binds 127.0.0.1 (this machine only) unless --host
says otherwise, and prints the address to open. Page by page: docs/serve.md.
"""
from __future__ import annotations

from typing import Sequence

from absl import flags

from avtext import cli
from avtext import errors

FLAGS = flags.FlagValues()
_INDEX = flags.DEFINE_multi_string("index", [], "an avtext.index directory to search "
                                   "(repeat for several; ~ is expanded)", flag_values=FLAGS)
_WORKDIR = cli.DEFINE_path("workdir", None, "the retrieval run to search the indexes with "
                           "(default: the run the first --index was built with)",
                           flag_values=FLAGS)
_STEP = cli.DEFINE_checkpoint_step(FLAGS, "with --workdir: its checkpoint, N, 'best' or the "
                                   "latest (default)")
_CAPTION_WORKDIR = cli.DEFINE_path("caption_workdir", None, "a captioning run for the "
                                   "Caption page (e.g. workdirs/demo/caption)",
                                   flag_values=FLAGS)
_CAPTION_STEP = cli.DEFINE_checkpoint_step(FLAGS, "the captioning run's checkpoint: N, "
                                           "'best' or the latest (default)", "caption_step")
_MOMENTS_WORKDIR = cli.DEFINE_path("moments_workdir", None, "the XML run that encoded "
                                   "--corpus", flag_values=FLAGS)
_MOMENTS_STEP = cli.DEFINE_checkpoint_step(FLAGS, "the XML run's checkpoint: N, 'best' or "
                                           "the latest (default)", "moments_step")
_CORPUS = cli.DEFINE_path("corpus", None, "a stored moment corpus of that run and step "
                          "(workdir/corpus/<eval>_step<N>)", flag_values=FLAGS)
_MOMENT_VIDEOS = cli.DEFINE_path("moment_videos", None, "a folder holding the corpus' videos "
                                 "as <vid_name>.<ext>, to play the moments found",
                                 flag_values=FLAGS)
_HOST = flags.DEFINE_string("host", "127.0.0.1", "the address to listen on (127.0.0.1: "
                            "this machine only)", flag_values=FLAGS)
_PORT = flags.DEFINE_integer("port", 8000, "the port to listen on (0: any free one)",
                             lower_bound=0, upper_bound=65535, flag_values=FLAGS)
_MAX_UPLOAD_MB = flags.DEFINE_float("max_upload_mb", 64.0, "the largest video the Caption "
                                    "page accepts as an upload, in MiB", lower_bound=0.001,
                                    flag_values=FLAGS)


def listen(host: str, port: int):
  """A socket listening on host:port (port 0: a free one); a busy or foreign address is a
  one-line error."""
  import socket  # pylint: disable=g-import-not-at-top
  sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  try:
    sock.bind((host, port))
    sock.listen(2048)  # from here on connections wait for the server, none is refused
  except OSError as e:
    sock.close()
    raise errors.BadInput(f"--host={host} --port={port}: cannot listen there ({e.strerror}); "
                          "pick another --port") from None
  return sock


def server(served):
  """uvicorn's server of the app over `served`; `.run(sockets=[listen(...)])` serves
  until interrupted (or `.should_exit`)."""
  import uvicorn  # pylint: disable=g-import-not-at-top
  from avtext.serve import app as app_lib  # pylint: disable=g-import-not-at-top
  return uvicorn.Server(uvicorn.Config(app_lib.build(served), log_level="warning",
                                       access_log=False))


def main(argv: Sequence[str]) -> None:
  from avtext.serve import served as served_lib  # pylint: disable=g-import-not-at-top
  if len(argv) > 1:
    raise errors.BadInput(f"unexpected arguments {list(argv[1:])}; see --help")
  if _CORPUS.value:
    cli.check_input_dir("corpus", _CORPUS.value, "corpus store")
  served = served_lib.Served(
      indexes=[cli.expand(p) for p in _INDEX.value], workdir=_WORKDIR.value,
      step=cli.parse_step(_STEP.value), caption_workdir=_CAPTION_WORKDIR.value,
      caption_step=cli.parse_step(_CAPTION_STEP.value),
      moments_workdir=_MOMENTS_WORKDIR.value,
      moments_step=cli.parse_step(_MOMENTS_STEP.value), corpus=_CORPUS.value,
      moment_videos=_MOMENT_VIDEOS.value, max_upload_mb=_MAX_UPLOAD_MB.value)
  sock = listen(_HOST.value, _PORT.value)
  host = f"[{_HOST.value}]" if ":" in _HOST.value else _HOST.value
  print(f"avtext.serve: open http://{host}:{sock.getsockname()[1]}/ (Ctrl-C stops it)",
        flush=True)
  server(served).run(sockets=[sock])


if __name__ == "__main__":
  cli.run(main, FLAGS)
