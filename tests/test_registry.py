"""avtext.config_registry: entries found by reading the package, imported only when looked up."""
import sys
import textwrap

import pytest


@pytest.fixture
def fake_package(tmp_path, monkeypatch):
  pkg = tmp_path / "fakepkg"
  pkg.mkdir()
  (pkg / "__init__.py").write_text(textwrap.dedent("""
      from avtext import config_registry
      THINGS = config_registry.Registry("thing", "fakepkg", "register_thing")
      register_thing = THINGS.register
      """))
  (pkg / "bees.py").write_text(textwrap.dedent("""
      import fakepkg

      @fakepkg.register_thing("bee")
      def bee():
        return "bee"
      """))
  (pkg / "prefixed.py").write_text(textwrap.dedent("""
      from fakepkg import register_thing
      register_thing("px:", prefix=True)(lambda: "px")
      """))
  (pkg / "silent.py").write_text("# names register_thing('ghost') in a comment only\n"
                                 "X = 'register_thing(\"ghost\")'\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  yield
  for name in [m for m in sys.modules if m == "fakepkg" or m.startswith("fakepkg.")]:
    del sys.modules[name]


def test_names_come_from_the_source_without_importing(fake_package):
  import fakepkg  # pylint: disable=g-import-not-at-top
  assert fakepkg.THINGS.names() == ["bee", "px:<name>"]
  assert "fakepkg.bees" not in sys.modules and "fakepkg.prefixed" not in sys.modules


def test_get_imports_only_the_module_of_the_name(fake_package):
  import fakepkg  # pylint: disable=g-import-not-at-top
  assert fakepkg.THINGS.get("bee", where="config.thing")() == "bee"
  assert "fakepkg.bees" in sys.modules and "fakepkg.prefixed" not in sys.modules
  assert fakepkg.THINGS.get("px:anything", where="config.thing")() == "px"
  with pytest.raises(ValueError, match=r"config.thing='px:'; registered things: \['bee', 'px:<name>'\]"):
    fakepkg.THINGS.get("px:", where="config.thing")  # a bare prefix names nothing


def test_a_taken_name_is_refused_and_a_reload_replaces(fake_package):
  import fakepkg  # pylint: disable=g-import-not-at-top
  bee = fakepkg.THINGS.get("bee", where="config.thing")
  with pytest.raises(ValueError, match=r"thing 'bee' is already registered by fakepkg.bees.bee"):
    fakepkg.register_thing("bee")(lambda: None)
  fakepkg.register_thing("bee")(bee)  # the same entry again (importlib.reload): fine


def test_a_registry_reads_several_packages_in_order(fake_package, tmp_path):
  other = tmp_path / "otherpkg"
  other.mkdir()
  (other / "__init__.py").write_text("")
  (other / "more.py").write_text(textwrap.dedent("""
      import fakepkg

      @fakepkg.register_thing("wasp")
      def wasp():
        return "wasp"
      """))
  try:
    from avtext import config_registry  # pylint: disable=g-import-not-at-top
    import fakepkg  # pylint: disable=g-import-not-at-top
    both = config_registry.Registry("thing", ("fakepkg", "otherpkg"), "register_thing")
    assert both.names() == ["bee", "wasp", "px:<name>"]
    assert "otherpkg.more" not in sys.modules
    fakepkg.register_thing = both.register  # the modules register through the new table
    assert both.get("wasp", where="config.thing")() == "wasp"
    assert "otherpkg.more" in sys.modules and "fakepkg.bees" not in sys.modules
  finally:
    for name in [m for m in sys.modules if m == "otherpkg" or m.startswith("otherpkg.")]:
      del sys.modules[name]


def test_installed_packages_join_a_registry_through_entry_points(fake_package, tmp_path,
                                                                   monkeypatch):
  """The group `avtext.<kind>s` adds packages or single modules after the registry's own;
  a value that is not importable here is left out."""
  import importlib.metadata  # pylint: disable=g-import-not-at-top
  (tmp_path / "plugin_things.py").write_text(textwrap.dedent("""
      import fakepkg

      @fakepkg.register_thing("moth")
      def moth():
        return "moth"
      """))
  points = [importlib.metadata.EntryPoint("p", "plugin_things", "avtext.things"),
            importlib.metadata.EntryPoint("gone", "no_such_package.mod", "avtext.things"),
            importlib.metadata.EntryPoint("q", "plugin_things", "avtext.other")]
  monkeypatch.setattr(importlib.metadata, "entry_points",
                      lambda group: [p for p in points if p.group == group])
  try:
    import fakepkg  # pylint: disable=g-import-not-at-top
    assert fakepkg.THINGS.plugins() == ("plugin_things",)
    assert fakepkg.THINGS.names() == ["bee", "moth", "px:<name>"]
    assert "plugin_things" not in sys.modules
    assert fakepkg.THINGS.get("moth", where="config.thing")() == "moth"
  finally:
    sys.modules.pop("plugin_things", None)


def test_the_demo_world_joins_through_setup_py():
  """setup.py's entry points reach the world's datasets and world.json formats (the
  installed metadata: `make venv` writes it)."""
  from avtext.data import builders  # pylint: disable=g-import-not-at-top
  from avtext.data import ground_truth  # pylint: disable=g-import-not-at-top
  assert builders.DATASETS.plugins() == ("avworld.datasets",)
  assert {"synthetic_clips", "synthetic_smit"} <= set(builders.registered_names())
  assert ground_truth.WORLDS.plugins() == ("avworld",)
  assert ground_truth.WORLDS.names() == ["avtext.mining_world/<name>",
                                         "avtext.synthetic_world/<name>"]
