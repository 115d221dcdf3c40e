"""The Starlette application of `avtext.serve` over a `served.Served`.

Pages: / (search videos and moments), /caption, /run. JSON: /api/search, /api/moments,
/api/video, /api/caption (a video of an index), /api/upload (raw body, at most
--max_upload_mb). Files: /media/<collection>/<id> (Starlette's FileResponse: HTTP Range
requests, so the player seeks) and /frame/<collection>/<id>?t=S (a JPEG). A mistake in a
request answers its 4xx with one line (JSON {"error"} under /api/, a page elsewhere);
anything else is a 500 with one line, its traceback on the server's stderr only.
"""
from __future__ import annotations

import html
import logging
import traceback

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse
from starlette.responses import HTMLResponse
from starlette.responses import JSONResponse
from starlette.responses import Response
from starlette.routing import Route

from avtext import cli
from avtext.serve import page
from avtext.serve import served as served_lib

RequestError = served_lib.RequestError
MEDIA_TYPES = {".mp4": "video/mp4", ".m4v": "video/mp4", ".webm": "video/webm",
               ".mkv": "video/x-matroska", ".avi": "video/x-msvideo", ".mov": "video/quicktime"}


def _int(request: Request, name: str, default: int | None) -> int | None:
  value = request.query_params.get(name)
  if value in (None, ""):
    return default
  try:
    return int(value)
  except ValueError:
    raise RequestError(400, f"{name}={value!r}: not a whole number") from None


def _float(request: Request, name: str) -> float:
  value = request.query_params.get(name, "0")
  try:
    return float(value)
  except ValueError:
    raise RequestError(400, f"{name}={value!r}: not a number of seconds") from None


def build(served: served_lib.Served) -> Starlette:
  """The application; `served` answers every request."""

  async def search_page(request: Request):
    return HTMLResponse(page.search_page(served))

  async def caption_page(request: Request):
    return HTMLResponse(page.caption_page(served))

  async def run_page(request: Request):
    view = await run_in_threadpool(served.run_view, request.query_params.get("name"))
    return HTMLResponse(page.run_page(served, view))

  async def api_search(request: Request):
    q = request.query_params
    return JSONResponse(await run_in_threadpool(
        served.search, q.get("q", ""), q.get("index"), _int(request, "top", 5)))

  async def api_moments(request: Request):
    return JSONResponse(await run_in_threadpool(
        served.search_moments, request.query_params.get("q", ""), _int(request, "top", 10)))

  async def api_video(request: Request):
    q = request.query_params
    return JSONResponse(await run_in_threadpool(served.video, q.get("collection", ""),
                                                q.get("video", "")))

  async def api_caption(request: Request):
    try:
      body = await request.json()
    except ValueError:
      raise RequestError(400, "the request body is not JSON") from None
    if not isinstance(body, dict):
      raise RequestError(400, "the request body is not a JSON object")
    beam = body.get("beam")
    if beam is not None and not isinstance(beam, int):
      raise RequestError(400, f"beam {beam!r}: not a whole number")
    return JSONResponse(await run_in_threadpool(
        served.caption_video, str(body.get("collection", "")), str(body.get("video", "")),
        beam))

  async def api_upload(request: Request):
    limit = served.max_upload_bytes
    name = request.query_params.get("name", "")
    declared = request.headers.get("content-length")
    too_big = RequestError(413, f"{name or 'the upload'}: larger than the limit of "
                           f"{served.max_upload_mb:g} MiB (--max_upload_mb)")
    if declared and declared.isdigit() and int(declared) > limit:
      raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():
      size += len(chunk)
      if size > limit:
        raise too_big
      chunks.append(chunk)
    return JSONResponse(await run_in_threadpool(
        served.caption_upload, b"".join(chunks), name, _int(request, "beam", None)))

  async def media(request: Request):
    collection, video = request.path_params["collection"], request.path_params["video"]
    path = await run_in_threadpool(served.collection(collection).path, video)
    return FileResponse(path, media_type=MEDIA_TYPES.get(path.suffix.lower(),
                                                         "application/octet-stream"))

  async def frame(request: Request):
    jpeg = await run_in_threadpool(
        served.frame, request.path_params["collection"], request.path_params["video"],
        _float(request, "t"), _int(request, "height", 96))
    return Response(jpeg, media_type="image/jpeg",
                    headers={"cache-control": "max-age=3600"})

  def _answer(request: Request, status: int, message: str):
    if request.url.path.startswith("/api/"):
      return JSONResponse({"error": message}, status_code=status)
    return HTMLResponse(page.error_page(served, status, message), status_code=status)

  async def on_request_error(request: Request, exc: RequestError):
    return _answer(request, exc.status, exc.message)

  async def on_http_error(request: Request, exc: HTTPException):
    message = ("no such page or file" if exc.status_code == 404 else str(exc.detail))
    return _answer(request, exc.status_code, f"{request.url.path}: {message}")

  async def on_error(request: Request, exc: Exception):
    logging.error("%s %s failed:\n%s", request.method, request.url.path,
                  "".join(traceback.format_exception(exc)))
    return _answer(request, 500, f"internal error ({type(exc).__name__}: "
                   f"{html.escape(cli.exception_message(exc))[:300]}); the server's log "
                   "has the details")

  routes = [
      Route("/", search_page), Route("/caption", caption_page), Route("/run", run_page),
      Route("/api/search", api_search), Route("/api/moments", api_moments),
      Route("/api/video", api_video), Route("/api/caption", api_caption, methods=["POST"]),
      Route("/api/upload", api_upload, methods=["POST"]),
      Route("/media/{collection}/{video:path}", media, methods=["GET", "HEAD"]),
      Route("/frame/{collection}/{video:path}", frame),
  ]
  return Starlette(routes=routes, exception_handlers={
      RequestError: on_request_error, HTTPException: on_http_error, Exception: on_error})
