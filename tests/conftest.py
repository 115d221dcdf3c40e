"""Test setup shared by every test.

Eight fake CPU devices are configured before JAX is imported anywhere, so
sharding tests can build meshes of 1 or 8 devices in the same process.
Unsharded code still runs on device 0 only.
"""
import atexit
import os
import shutil
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
from avtext import cli  # pylint: disable=g-import-not-at-top,wrong-import-position
cli.safe_cpu_collectives()  # before any computation (the 8 devices' collectives)
# The programs' caches (compilation, exported programs, run snapshots) in one directory
# per test run, never the user's ~/.cache.
if "AVTEXT_TEST_CACHES" not in os.environ:  # the controller; xdist workers inherit it
  os.environ["AVTEXT_TEST_CACHES"] = tempfile.mkdtemp(prefix="avtext_test_caches_")
  atexit.register(shutil.rmtree, os.environ["AVTEXT_TEST_CACHES"], True)
os.environ.setdefault("AVTEXT_COMPILATION_CACHE",
                      os.path.join(os.environ["AVTEXT_TEST_CACHES"], "jax"))
os.environ.setdefault("AVTEXT_RUN_CACHE", os.path.join(os.environ["AVTEXT_TEST_CACHES"], "runs"))
if os.environ.get("AVTEXT_TEST_JAX_CACHE", "1") != "0":
  # In-process tests share JAX's persistent compilation cache of this run (the CLIs'
  # processes use it through avtext.cli): the same small models compile once.
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_compilation_cache_dir", os.environ["AVTEXT_COMPILATION_CACHE"])
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


# Files whose tests take minutes (measured with --durations on a fresh clone),
# longest first. `make test` runs two xdist workers with --dist loadfile, which hands out
# files in collection order; starting these first keeps one worker from running
# the longest file alone at the end (12 min 19 s before this order existed).
_LONG_FILES = (
    "test_train_run_faults.py", "test_train_trainer.py", "test_train_fsdp_microbatches.py",
    "test_models_precision_families.py", "test_aot.py", "test_experiment.py",
    "test_inference_generate.py", "test_tasks_smit.py", "test_tasks_xml.py",
    "test_train_rundir.py", "test_index.py", "test_serve.py", "test_models_scan_layers.py",
    "test_tasks_example_spec.py", "test_tasks_mmt.py", "test_tasks_coot.py",
    "test_models_gpt2.py", "test_models_coot.py", "test_weights_official_mmt.py",
    "test_data_files.py", "test_cli.py", "test_cli_faults.py", "test_mining.py",
    "test_notebook.py")


def pytest_collection_modifyitems(items):
  rank = {name: i for i, name in enumerate(_LONG_FILES)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: order within
