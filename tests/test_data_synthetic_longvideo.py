"""The synthetic TVR / TVC long-video variant (avworld/longvideo.py)."""
import numpy as np
import pytest

from avworld import captions
from avworld import longvideo
from avworld import multiscene
from avworld import world

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
          assert stated and "sound" not in {a for a, _ in stated}  # visual content only
          continue
        speaker, topic = desc["said"]["speaker"], desc["said"]["topic"]
        assert desc["desc"].startswith(speaker)
        line = [s for s in d["subtitles"] if s["topic"] == topic]
        assert len(line) == 1 and line[0]["speaker"] == speaker
        listener = desc["said"]["listener"]
        assert (listener in d["cast"] and listener != speaker and listener in desc["desc"]
                if listener else not any(c in desc["desc"][len(speaker):]
                                         for c in longvideo.CAST))
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


def test_video_queries_are_referring_expressions_of_their_moment(source):
  """TVR: a query is a unique match in its video. A "v" description fits its own scene
  and no other scene of the video, whenever some visual description could (the scene
  does not look the same as another)."""
  checked = 0
  for i in range(len(source)):
    d = source.describe(i)
    for m in d["moments"]:
      others = [s["attributes"] for k, s in enumerate(d["scenes"]) if k != m["scene"]]
      full = longvideo.full_visual_mention(m["attributes"])
      distinct = not any(captions.caption_fits(full, o) for o in others)
      for desc in m["descs"]:
        if desc["type"] != "v":
          continue
        fits = longvideo.fitting_scenes(desc, d)
        assert fits == [m["scene"]] if distinct else m["scene"] in fits
        checked += distinct
  assert checked > 50


def _scene(shape, colour, motion, background="plain", sound="tone"):
  return {"num_objects": 1, "background": background, "sound": sound,
          "objects": [{"shape": shape, "colour": colour, "motion": motion}]}


def test_referring_mention_tells_the_scene_from_the_others_or_says_everything():
  rng = np.random.default_rng(0)
  me = _scene("circle", "red", "up")
  others = [_scene("circle", "red", "down"), _scene("square", "red", "up", sound="drum")]
  for _ in range(20):
    m = longvideo.referring_mention(rng, me, others)
    assert "sound" not in m and captions.caption_fits(m, me)
    assert not any(captions.caption_fits(m, o) for o in others)
  # A scene that looks exactly like another (only the sound differs): no visual
  # mention can tell them apart, so the full visual description is the answer.
  twin = _scene("circle", "red", "up", sound="drum")
  m = longvideo.referring_mention(rng, me, [twin], tries=3)
  assert m == {"num_objects": 1, "background": "plain",
               "objects": [{"shape": "circle", "colour": "red", "motion": "up"}]}


def _video(cast, scenes_and_lines, moments):
  """A `describe`-shaped video: scenes of 1 s, one topic line each."""
  scenes = [{"start_s": float(k), "stop_s": k + 1.0, "attributes": a}
            for k, (a, _) in enumerate(scenes_and_lines)]
  subs = [{"start": k + 0.2, "end": k + 0.8, "speaker": sp, "topic": tp, "text": "",
           "about": None} for k, (_, (sp, tp)) in enumerate(scenes_and_lines)]
  return {"cast": cast, "scenes": scenes, "subtitles": subs,
          "moments": [{"moment_id": f"m{j}", "scene": k, "descs": [d]}
                      for j, (k, d) in enumerate(moments)]}


def test_query_oracle_by_hand():
  red_up, red_down = _scene("circle", "red", "up"), _scene("circle", "red", "down")
  blue = _scene("square", "blue", "still")
  red = {"objects": [{"colour": "red"}]}
  v_red = {"desc_id": "a", "type": "v", "mentioned": red}
  v_up = {"desc_id": "b", "type": "v", "mentioned": {"objects": [{"motion": "up"}]}}
  t_alice = {"desc_id": "c", "type": "t", "mentioned": {"objects": []},
             "said": {"speaker": "Alice", "topic": "keys", "listener": "Bob"}}
  vt = {"desc_id": "d", "type": "vt", "mentioned": red,
        "said": {"speaker": "Alice", "topic": "dog", "listener": None}}
  # video 0: red_up (Alice, keys), blue (Bob, dog); video 1: red_up (Alice, keys),
  # red_down (Alice, dog); video 2 (cast without Bob): red_down (Alice, keys).
  v0 = _video(["Alice", "Bob"], [(red_up, ("Alice", "keys")), (blue, ("Bob", "dog"))],
              [(0, v_red), (1, t_alice)])
  v1 = _video(["Alice", "Bob"], [(red_up, ("Alice", "keys")), (red_down, ("Alice", "dog"))],
              [(0, v_up), (1, vt)])
  v2 = _video(["Alice", "Carol"], [(red_down, ("Alice", "keys"))], [])
  assert longvideo.fitting_scenes(v_red, v1) == [0, 1]
  assert longvideo.fitting_scenes(t_alice, v1) == [0]
  assert longvideo.fitting_scenes(t_alice, v2) == []  # Bob is not in the cast
  assert longvideo.fitting_scenes(vt, v1) == [1]
  # v_red: scenes 0 | 0, 1 | 0 -> n = 4 in 3 videos, 1 in its own video.
  # v_up: 0 | 0 | - -> 2 in 2 videos, 1 own. t_alice: 0 | 0 | - (no Bob) -> 2 in 2.
  # vt: - | 1 | - -> 1 in 1. t_alice in its own video v0 is true of scene 0, not
  # its moment (scene 1): the oracle refuses it.
  with pytest.raises(ValueError, match="not true of its own moment"):
    longvideo.query_oracle([v0, v1, v2])
  v0["moments"][1]["scene"] = 0
  o = longvideo.query_oracle([v0, v1, v2])
  assert o["v"]["VCMR"] == pytest.approx(100 * (1 / 4 + 1 / 2) / 2)
  assert o["v"]["VR"] == pytest.approx(100 * (1 / 3 + 1 / 2) / 2)
  assert o["v"]["SVMR"] == 100.0 and o["v"]["num_queries"] == 2
  assert o["t"]["VCMR"] == o["t"]["VR"] == 50.0
  assert o["vt"]["VCMR"] == o["vt"]["VR"] == o["vt"]["SVMR"] == 100.0
  assert o["all"]["VCMR"] == pytest.approx(100 * (1 / 4 + 1 / 2 + 1 / 2 + 1) / 4)
  assert o["all"]["median_fitting_scenes"] == 2.0
