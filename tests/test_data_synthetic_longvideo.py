"""The synthetic TVR / TVC long-video variant (avtext/data/synthetic/longvideo.py)."""
import numpy as np
import pytest

from avtext.data.synthetic import captions
from avtext.data.synthetic import longvideo
from avtext.data.synthetic import multiscene
from avtext.data.synthetic import world

SPEC = world.WorldSpec(height=32, width=32)


@pytest.fixture(scope="module")
def source():
  return longvideo.LongVideoSource("val", num_examples=40, spec=SPEC)


def test_subtitles_stay_inside_their_scene_in_order(source):
  for i in range(len(source)):
    d = source.describe(i)
    bounds = source.video(i).boundaries
    subs = d["subtitles"]
    assert all(a["end"] <= b["start"] for a, b in zip(subs, subs[1:]))
    topics = [s["topic"] for s in subs if s["topic"]]
    assert len(topics) == len(d["scenes"]) == len(set(topics))  # one topic line per scene
    for s in subs:
      k = int(np.searchsorted(bounds, s["start"], side="right") - 1)
      assert bounds[k] <= s["start"] < s["end"] <= bounds[k + 1]
      assert s["text"] == f"{s['speaker']} : {s['text'].split(' : ', 1)[1]}"
      assert s["speaker"] in d["cast"]
      said = captions.parse_statements(s["text"].split(" : ", 1)[1])
      if s["topic"]:  # topic lines say nothing that can be seen or heard
        assert said == set()
      else:  # seen lines state true attributes of their scene only
        assert said and said <= captions.clip_statements(d["scenes"][k]["attributes"])
        assert said == captions.mention_statements(s["about"])


def test_moment_descriptions_state_what_their_type_says(source):
  types = {t: 0 for t in longvideo.QUERY_TYPES}
  for i in range(len(source)):
    d = source.describe(i)
    assert d["num_clips"] == int(np.ceil(d["duration_s"] / 1.5 - 1e-9))
    scenes = [m["scene"] for m in d["moments"]]
    assert len(set(scenes)) == len(scenes) == min(3, len(d["scenes"]))
    for m in d["moments"]:
      scene = d["scenes"][m["scene"]]
      assert m["ts"] == [scene["start_s"], scene["stop_s"]]
      assert len(m["descs"]) == 4  # TVC val / test
      for desc in m["descs"]:
        types[desc["type"]] += 1
        stated = captions.parse_statements(desc["desc"])
        # The text says exactly the mentioned attributes, and they are true of the moment.
        assert stated == captions.mention_statements(desc["mentioned"])
        assert captions.caption_fits(desc["mentioned"], m["attributes"])
        if desc["type"] == "v":
          assert "said" not in desc
          continue
        speaker, topic = desc["said"]["speaker"], desc["said"]["topic"]
        assert desc["desc"].startswith(speaker)
        line = [s for s in d["subtitles"] if s["topic"] == topic]
        assert len(line) == 1 and line[0]["speaker"] == speaker
        assert scene["start_s"] <= line[0]["start"] < line[0]["end"] <= scene["stop_s"]
        if desc["type"] == "t":
          assert stated == set()
        else:
          assert stated and "sound" not in {a for a, _ in stated}
  assert min(types.values()) > 0.2 * sum(types.values())


def test_long_videos_are_the_multiscene_generator_with_their_own_stream():
  src = longvideo.LongVideoSource("train", num_examples=3, spec=SPEC)
  assert src.describe(0)["moments"][0]["descs"][0]["desc_id"].startswith("longvideo-train-s0-")
  assert len(src.describe(0)["moments"][0]["descs"]) == 2  # TVC train: 2 per moment
  video = src.video(1)
  first = int(round(video.boundaries[1] * SPEC.fps))
  np.testing.assert_array_equal(src.render_frames(1, [first]),
                                multiscene.render_frames(video, [first / SPEC.fps], SPEC))
  again = longvideo.LongVideoSource("train", num_examples=3, spec=SPEC)
  assert again.describe(1) == src.describe(1)
  paragraphs = multiscene.MultiSceneSource("train", num_examples=3, spec=SPEC)
  assert paragraphs.video(1).boundaries != video.boundaries  # disjoint streams
