"""`python -m avtext.serve`: the page over a synthetic index whose top hits are known
(tests/serve_world.py), through Starlette's TestClient and in headless Chromium.

The browser tests drive Debian's chromium (`make browser`) through Playwright, which
downloads no browser; where /usr/bin/chromium (or AVTEXT_CHROMIUM) is missing they skip
and say so. With AVTEXT_SCREENSHOTS=DIR they also write the README's screenshots there
(`AVTEXT_SCREENSHOTS=docs/images .venv/bin/pytest tests/test_serve.py`).
"""
import json
import os
import pathlib
import threading
import time

import pytest

from avtext.serve import __main__ as serve_main
from avtext.serve import served as served_lib
from tests import serve_world

CHROMIUM = os.environ.get("AVTEXT_CHROMIUM", "/usr/bin/chromium")
INDEX = "my_videos.index"
# The K = 4 clips of a 4 s video at 25 fps, 4 frames 10 apart (the tiny config): frames
# 0, 23, 46 and 69 start them (video.test_clip_indices); the best clip is the third.
CLIP_START, CLIP_END = 46 / 25, (46 + 31) / 25


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  return serve_world.build(tmp_path_factory.mktemp("serve"))


@pytest.fixture(scope="module")
def served(world):
  served = served_lib.Served(indexes=[str(world["index"]), str(world["other"])],
                             caption_workdir=str(world["caption"]), max_upload_mb=0.05)
  served.moments = serve_world.Moments()  # a stand-in for an XML run's Searcher
  served.moment_videos = served_lib.moment_collection(world["moment_videos"])
  return served


@pytest.fixture(scope="module")
def client(served):
  from starlette.testclient import TestClient  # pylint: disable=g-import-not-at-top
  from avtext.serve import app  # pylint: disable=g-import-not-at-top
  return TestClient(app.build(served), raise_server_exceptions=False)


# ---------------------------------------------------------------- HTTP, no browser

def test_paths_outside_the_index_are_refused(world, client):
  video = world["videos"] / "clip0.mp4"
  whole = client.get(f"/media/{INDEX}/clip0.mp4")
  assert whole.status_code == 200 and whole.content == video.read_bytes()
  part = client.get(f"/media/{INDEX}/more/clip1.mp4", headers={"Range": "bytes=100-199"})
  assert part.status_code == 206 and part.headers["content-range"].startswith("bytes 100-199/")
  assert part.content == (world["videos"] / "more" / "clip1.mp4").read_bytes()[100:200]
  secret = world["index"].parent / "secret.txt"
  secret.write_text("not for the page")
  rel = os.path.relpath(secret, world["videos"])  # ../secret.txt
  refused = [
      f"/media/{INDEX}/../secret.txt", f"/media/{INDEX}/more/../../secret.txt",
      f"/media/{INDEX}/%2e%2e/secret.txt", f"/media/{INDEX}/%2E%2E%2Fsecret.txt",
      f"/media/{INDEX}/more%2f..%2f..%2fsecret.txt", f"/media/{INDEX}/%252e%252e%252fsecret.txt",
      f"/media/{INDEX}/{secret}", f"/media/{INDEX}/%2F{str(secret).lstrip('/')}",
      f"/media/{INDEX}//{secret}", f"/media/{INDEX}/..%5csecret.txt",
      f"/media/{INDEX}/{rel}", f"/media/{INDEX}/%2e%2e%2f%2e%2e%2fetc%2fpasswd",
      "/media/..%2f..%2fetc/passwd", f"/frame/{INDEX}/..%2fsecret.txt?t=0",
      f"/media/{INDEX}/secret.txt", f"/media/{INDEX}/clip9.mp4", "/media/nope/clip0.mp4",
      f"/api/video?collection={INDEX}&video=..%2Fsecret.txt",
      f"/api/video?collection={INDEX}&video={secret}",
      "/../../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd", f"/media/{INDEX}/gone.mp4"]
  for url in refused:
    r = client.get(url)
    assert 400 <= r.status_code < 500, (url, r.status_code)
    assert b"not for the page" not in r.content and b"root:" not in r.content, url
    assert b"Traceback" not in r.content, url


def test_search_finds_the_known_top_hit_and_its_best_clip(client):
  for j, query in enumerate(serve_world.QUERIES):
    r = client.get("/api/search", params={"q": query, "index": INDEX, "top": 5})
    assert r.status_code == 200, r.text
    hits = r.json()["hits"]
    assert hits[0]["video"] == serve_world.video_name(j)
    assert hits[0]["score"] == pytest.approx(1.0, abs=1e-3)
    assert all(h["score"] < 0.6 for h in hits[1:])
    assert hits[0]["best_clip"] == serve_world.BEST_CLIP
    assert (hits[0]["start"], hits[0]["end"]) == pytest.approx((CLIP_START, CLIP_END))
  gone = client.get("/api/search", params={"q": serve_world.QUERIES[0]}).json()["hits"][1]
  assert gone["video"] == "gone.mp4" and "deleted" in gone["error"]


def test_moments_come_with_their_span_and_how_they_play(client):
  r = client.get("/api/moments", params={"q": "anything", "top": 3})
  assert r.status_code == 200, r.text
  clip1, clip5, absent = r.json()["moments"]
  assert (clip1["video"], clip1["start"], clip1["end"], clip1["duration"]) == ("clip1", 1, 2, 4)
  assert (clip1["collection"], clip1["kind"], clip5["kind"]) == ("moments", "video", "frames")
  assert "no file absent.<ext>" in absent["error"]
  frame = client.get("/frame/moments/clip5", params={"t": 2.5})
  assert frame.status_code == 200 and frame.content[:2] == b"\xff\xd8"  # a JPEG


@pytest.mark.parametrize("url,status,words", [
    ("/api/search?q=%20%20", 400, "empty query"),
    ("/api/search?q=x&index=other.index", 409, "built with another model"),
    ("/api/search?q=x&index=nope", 404, "nope: no such index"),
    ("/api/search?q=x&top=many", 400, "not a whole number"),
    (f"/api/video?collection={INDEX}&video=nope.mp4", 404, "no such video"),
    (f"/api/video?collection={INDEX}&video=gone.mp4", 410, "deleted"),
    ("/api/moments?q=", 400, "empty query"),
    ("/run?name=nope", 404, "no such run"),
])
def test_bad_requests_answer_one_line(client, url, status, words):
  r = client.get(url)
  assert r.status_code == status and words in r.text, (url, r.status_code, r.text[:300])
  assert "Traceback" not in r.text


def test_caption_and_bad_uploads(world, client, served):
  from avtext import caption  # pylint: disable=g-import-not-at-top
  r = client.post("/api/caption", json={"collection": INDEX, "video": "clip2.mp4", "beam": 1})
  assert r.status_code == 200, r.text
  expected = caption.Captioner(world["caption"])([str(world["videos"] / "clip2.mp4")])[0][1]
  assert r.json()["caption"] == expected and r.json()["seconds"] > 0
  upload = client.post("/api/upload?name=clip2.mp4&beam=1",
                       content=(world["videos"] / "clip2.mp4").read_bytes())
  assert upload.status_code == 200 and upload.json()["caption"] == expected
  for name, body, status, words in (
      ("notes.mp4", world["notes"].read_bytes(), 415, "not a video that can be read"),
      ("notes.txt", b"hello", 415, "not a video file"),
      ("big.mp4", world["big"].read_bytes(), 413, "larger than the limit of 0.05 MiB")):
    r = client.post(f"/api/upload?name={name}", content=body)
    assert r.status_code == status and words in r.json()["error"], (name, r.text)
  r = client.post("/api/caption", json={"collection": INDEX, "video": "../secret.txt"})
  assert r.status_code == 400 and "'..'" in r.json()["error"]
  assert client.post("/api/caption", content=b"{").status_code == 400


def test_run_page_shows_curves_metrics_and_config(world, client):
  r = client.get("/run", params={"name": "search"})
  assert r.status_code == 200
  assert 'data-tag="loss"' in r.text
  results = json.loads((world["avr"] / "results.json").read_text())
  assert results and "t2v_R@1" in r.text
  assert json.loads((world["avr"] / "config.json").read_text())["task"] in r.text


def test_the_program_refuses_bad_flags_in_one_line(tmp_path, capsys):
  from avtext import cli  # pylint: disable=g-import-not-at-top
  for argv, words in ((["--port=80000"], "--port"), ([], "nothing to serve"),
                      ([f"--index={tmp_path}"], "not an avtext index"),
                      ([f"--index={tmp_path / 'x'}"], "no such directory"),
                      ([f"--corpus={tmp_path}"], "together")):
    with pytest.raises(SystemExit) as done:
      cli.run(serve_main.main, serve_main.FLAGS, ["avtext.serve", *argv])
    err = capsys.readouterr().err
    assert done.value.code == 2 and words in err and len(err.strip().splitlines()) == 1, err


# ---------------------------------------------------------------- in the browser

@pytest.fixture(scope="module")
def live(served):
  sock = serve_main.listen("127.0.0.1", 0)
  server = serve_main.server(served)
  thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
  thread.start()
  while not server.started:
    time.sleep(0.05)
  yield f"http://127.0.0.1:{sock.getsockname()[1]}"
  server.should_exit = True
  thread.join(10)


@pytest.fixture(scope="module")
def browser():
  if not os.path.exists(CHROMIUM):
    pytest.skip(f"no browser: {CHROMIUM} is missing (make browser installs Debian's chromium)")
  sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed "
                                 "(make venv installs requirements-dev.txt)")
  with sync_api.sync_playwright() as p:
    chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
    yield chromium
    chromium.close()


@pytest.fixture
def page(browser, live):
  context = browser.new_context(base_url=live, viewport={"width": 1200, "height": 760})
  tab = context.new_page()
  yield tab
  context.close()


def _shot(tab, name: str) -> None:
  folder = os.environ.get("AVTEXT_SCREENSHOTS")
  if folder:
    pathlib.Path(folder).mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=str(pathlib.Path(folder) / name))


def _search(tab, query: str, index: str = INDEX) -> None:
  tab.goto("/")
  tab.select_option("#index", index) if index else None
  tab.fill("#query", query)
  tab.click("#go")


def test_page_shows_the_known_top_hit_first_and_plays_it_from_its_clip(page):
  _search(page, serve_world.QUERIES[1])
  page.wait_for_selector("#hits .hit")
  first = page.locator("#hits .hit").first
  assert first.get_attribute("data-video") == serve_world.video_name(1)
  assert "1.84 - 3.08 s" in first.inner_text()
  assert page.locator("#hits .hit").first.locator(".strip img").count() == 4
  first.click()
  page.wait_for_function("window.avtextSeeked === true", timeout=20000)
  now = page.evaluate("document.getElementById('player').currentTime")
  assert now == pytest.approx(CLIP_START, abs=0.3)
  src = page.evaluate("document.getElementById('player').currentSrc")
  assert src.endswith("/media/my_videos.index/more/clip1.mp4")
  page.wait_for_function(f"document.getElementById('player').currentTime > {CLIP_START + 0.3}",
                         timeout=20000)  # it plays on
  _shot(page, "serve_search.png")
  page.wait_for_function("document.getElementById('player').paused", timeout=20000)
  assert page.evaluate("document.getElementById('player').currentTime") == pytest.approx(
      CLIP_END, abs=0.3)  # and stops at the clip's end


def test_page_shows_moments_on_the_timeline_and_plays_them(page):
  page.goto("/")
  page.fill("#query", "anything")
  page.click("#moments")
  page.wait_for_selector("#hits .hit")
  first = page.locator("#hits .hit").first
  assert first.get_attribute("data-video") == "clip1"
  span = first.locator(".timeline span")
  assert span.evaluate("s => [s.style.left, s.style.width]") == ["25%", "25%"]  # 1-2 s of 4
  first.click()
  page.wait_for_function("window.avtextSeeked === true", timeout=20000)
  assert page.evaluate("document.getElementById('player').currentTime") == pytest.approx(
      1.0, abs=0.3)
  page.locator("#hits .hit").nth(1).click()  # clip5.mkv: shown as frames from 2 s
  page.wait_for_function("(f => f.src.includes('t=2') && f.complete && f.naturalWidth > 0)"
                         "(document.getElementById('frames'))", timeout=20000)
  assert page.locator("#frames").is_visible() and not page.locator("#player").is_visible()
  page.locator("#hits .hit").nth(2).click()
  assert "no file absent.<ext>" in page.inner_text("#message")


def test_page_captions_a_video_of_the_index(page, world):
  from avtext import caption  # pylint: disable=g-import-not-at-top
  expected = caption.Captioner(world["caption"])([str(world["videos"] / "clip0.mp4")])[0][1]
  page.goto("/caption")
  page.select_option("#video", json.dumps([INDEX, "clip0.mp4"]))
  page.click("#go")
  page.wait_for_function("document.getElementById('caption').textContent.length > 0",
                         timeout=60000)
  assert page.inner_text("#caption") == expected
  assert "greedy" in page.inner_text("#took") and " s" in page.inner_text("#took")


def test_run_page_draws_the_loss_curve(page, world):
  page.goto("/run?name=search")
  curve = page.locator('svg.curve[data-tag="loss"] polyline')
  points = curve.get_attribute("points").split()
  assert len(points) == 3  # three logged steps
  results = json.loads((world["avr"] / "results.json").read_text())["latest"]
  row = page.locator("#results tr", has_text="test/t2v_R@1").first.inner_text().split()
  assert row[0] == "test/t2v_R@1" and float(row[-1]) == pytest.approx(results["test/t2v_R@1"])
  _shot(page, "serve_run.png")


@pytest.mark.parametrize("case", ["empty query", "another model", "unknown video",
                                  "dot-dot path", "absolute path", "deleted video",
                                  "not a video", "too large"])
def test_page_says_what_is_wrong(page, world, case):
  message = page.locator("#message")
  if case == "empty query":
    _search(page, "   ")
    expected = "empty query"
  elif case == "another model":
    _search(page, "x", index="other.index")
    expected = "built with another model"
  elif case in ("unknown video", "dot-dot path", "absolute path"):
    video = {"unknown video": "clip9.mp4", "dot-dot path": "../secret.txt",
             "absolute path": "/etc/passwd"}[case]
    page.goto(f"/media/{INDEX}/" + video.replace("/", "%2F"))
    message = page.locator("#error")
    expected = {"unknown video": "no such video", "dot-dot path": "a path with '..'",
                "absolute path": "an absolute path"}[case]
  elif case == "deleted video":
    _search(page, serve_world.QUERIES[0])
    page.wait_for_selector("#hits .hit.bad")
    page.locator("#hits .hit.bad").click()
    expected = "gone.mp4: deleted"
  else:
    page.goto("/caption")
    page.set_input_files("#file", str(world["notes" if case == "not a video" else "big"]))
    page.click("#send")
    expected = {"not a video": "not a video that can be read",
                "too large": "larger than the limit of 0.05 MiB"}[case]
  message.wait_for(state="visible", timeout=30000)
  assert expected in message.inner_text(), (case, message.inner_text())
