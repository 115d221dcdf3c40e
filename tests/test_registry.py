"""avtext.registry: entries found by reading the package, imported only when looked up."""
import sys
import textwrap

import pytest


@pytest.fixture
def fake_package(tmp_path, monkeypatch):
  pkg = tmp_path / "fakepkg"
  pkg.mkdir()
  (pkg / "__init__.py").write_text(textwrap.dedent("""
      from avtext import registry
      THINGS = registry.Registry("thing", "fakepkg", "register_thing")
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
    from avtext import registry  # pylint: disable=g-import-not-at-top
    import fakepkg  # pylint: disable=g-import-not-at-top
    both = registry.Registry("thing", ("fakepkg", "otherpkg"), "register_thing")
    assert both.names() == ["bee", "wasp", "px:<name>"]
    assert "otherpkg.more" not in sys.modules
    fakepkg.register_thing = both.register  # the modules register through the new table
    assert both.get("wasp", where="config.thing")() == "wasp"
    assert "otherpkg.more" in sys.modules and "fakepkg.bees" not in sys.modules
  finally:
    for name in [m for m in sys.modules if m == "otherpkg" or m.startswith("otherpkg.")]:
      del sys.modules[name]
