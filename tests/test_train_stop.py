"""Stopping on a signal: one process alone, several by agreement; a lost process.

In-process, against stand-ins for JAX's preemption sync manager and the coordination
service's key-value store (the real ones run in the 2-process tests of
tests/test_train_multihost.py). A tiny AVR run signalled during an evaluation: at a
middle step it stops after that step with its checkpoint, at the last step it finishes.
"""
import signal
import time

from absl import flags
import pytest

from avtext import cli
from avtext import errors
from avtext.train import hosts
from avtext.train import stop as stop_lib
from tests.test_train_failsoft import _FailingAt
from tests.test_train_run_faults import _steps
from tests.test_train_run_faults import _trainer
from tests.test_train_trainer import tiny_config


class _SyncManager:
  """reached_preemption_sync_point as the runtime computes it: after a notice, the
  furthest process's counter + 1 (here: the last counter seen + 1)."""

  def __init__(self):
    self.counters, self.sync_point = [], None

  def notice(self):
    self.sync_point = (self.counters[-1] if self.counters else 0) + 1

  def __call__(self, counter):
    self.counters.append(counter)
    return counter == self.sync_point


def test_one_process_stops_on_its_own_signal():
  stop = stop_lib.StopRequest(shared=False)
  with stop.catching():
    assert not stop.at_boundary(0) and not stop.requested
    signal.raise_signal(signal.SIGTERM)
    assert stop.at_boundary(1) and stop.requested and stop.exit_signal() == signal.SIGTERM
    with pytest.raises(KeyboardInterrupt):  # a second signal stops at once
      signal.raise_signal(signal.SIGINT)
  assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored


def test_several_processes_stop_at_the_agreed_boundary(monkeypatch):
  """The counter passed to the runtime is the boundary's rank (1, 2, ...), equal on every
  process whatever step training resumed from; the decision holds once taken."""
  sync = _SyncManager()
  monkeypatch.setattr(stop_lib.multihost_utils, "reached_preemption_sync_point", sync)
  stop = stop_lib.StopRequest(shared=True)
  assert [stop.at_boundary(step) for step in (40, 41, 42)] == [False] * 3
  sync.notice()  # another process got SIGTERM: the stop is at the 4th boundary, step 43
  assert not stop.requested
  assert stop.at_boundary(43) and stop.requested and stop.at_boundary(44)
  assert sync.counters == [1, 2, 3, 4]  # not called again once agreed
  assert stop.signum is None and stop.exit_signal() == signal.SIGTERM


def test_a_notice_before_the_first_boundary_stops_there(monkeypatch):
  sync = _SyncManager()
  monkeypatch.setattr(stop_lib.multihost_utils, "reached_preemption_sync_point", sync)
  sync.notice()  # during the set-up, before any counter: sync point 1
  assert stop_lib.StopRequest(shared=True).at_boundary(100)


def test_sigint_to_one_of_several_processes_becomes_the_runtimes_notice(monkeypatch):
  """SIGTERM stays with the runtime's handler; SIGINT is sent on to it as SIGTERM."""
  sent = []
  monkeypatch.setattr(stop_lib.os, "kill", lambda pid, signum: sent.append(signum))
  stop = stop_lib.StopRequest(shared=True)
  with stop.catching():
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # not taken from the runtime
    signal.raise_signal(signal.SIGINT)
    assert sent == [signal.SIGTERM] and stop.signum == signal.SIGINT
    assert not stop.requested  # until the processes agree
    assert stop.exit_signal() == signal.SIGINT


class _KeyValueStore:
  """The coordination service's key-value store; `gone`: the service is."""

  def __init__(self):
    self.store, self.gone = {}, False

  def key_value_set(self, key, value, allow_overwrite=False):
    if self.gone:
      raise RuntimeError("UNAVAILABLE: failed to connect to all addresses")
    assert allow_overwrite or key not in self.store
    self.store[key] = value

  def key_value_dir_get(self, prefix):
    if self.gone:
      raise RuntimeError("UNAVAILABLE: failed to connect to all addresses")
    return [(k, v) for k, v in self.store.items() if k.startswith(prefix)]


def test_the_watchdog_names_a_process_whose_beat_stopped():
  """4 processes, this one 0: 1 beats on, 2 stops beating, 3 left normally ("done")."""
  kv = _KeyValueStore()
  dog = hosts.Watchdog(kv, 0, 4, stale_s=10)
  seen = {}
  kv.store.update({"avtext/beat/1": "1", "avtext/beat/2": "1", "avtext/beat/3": "done"})
  assert dog.look(1, seen, now=0.0) == []
  kv.store["avtext/beat/1"] = "2"
  assert dog.look(2, seen, now=9.0) == []  # 2 silent for 9 s: not yet
  kv.store["avtext/beat/1"] = "3"
  assert dog.look(3, seen, now=10.5) == [2]  # 2 silent for 10.5 s; 1 and 3 are fine
  assert kv.store["avtext/beat/0"] == "3"  # its own beat
  dog.last_checkpoint = lambda: 4
  assert dog.message([2]) == ("process 2 of 4 was lost (killed, or its machine went "
                              "away); checkpoint 4 is the last on disk: relaunch the same "
                              "command on every host to resume")
  kv.gone = True  # process 0, which runs the service, went away
  assert dog.look(4, seen, now=11.0) == [0]
  dog.last_checkpoint = lambda: None
  assert dog.message([0, 1]).startswith(
      "process 0 (the coordinator), process 1 of 4 were lost (killed, or its machine went "
      "away); no checkpoint was written yet")


def test_the_watchdog_thread_exits_the_process_on_a_silent_peer():
  """Process 1 never beats: within stale_s + a beat or two, one line and the exit; a
  watchdog stopped first (a normal exit) leaves "done" for its peers."""
  kv, exits = _KeyValueStore(), []
  dog = hosts.Watchdog(kv, 0, 2, stale_s=0.5, exit_fn=exits.append)
  dog.start()
  try:
    deadline = time.monotonic() + 10
    while not exits and time.monotonic() < deadline:
      time.sleep(0.05)
  finally:
    dog.stop()
    hosts.Watchdog.running = None
  assert exits and exits[0].startswith("process 1 of 2 was lost")
  assert kv.store["avtext/beat/0"] == "done"


def test_a_failed_collective_waits_for_the_watchdog_only_on_a_peers_failure(monkeypatch):
  slept = []
  monkeypatch.setattr(hosts.time, "sleep", slept.append)
  hosts.lost(RuntimeError("Gloo all-reduce failed: Connection closed by peer"))
  assert slept == []  # one process: no watchdog
  monkeypatch.setattr(hosts.Watchdog, "running",
                      hosts.Watchdog(_KeyValueStore(), 0, 2, stale_s=10))
  hosts.lost(RuntimeError("RESOURCE_EXHAUSTED: out of memory allocating 3 GiB"))
  assert slept == []  # its own error: raised as it is
  hosts.lost(RuntimeError("Gloo all-reduce failed: Connection closed by peer"))
  assert slept == [13]  # the watchdog's verdict (it exits the process) comes first


def test_a_second_ctrl_c_to_a_process_of_a_job_exits_at_once(monkeypatch, capsys):
  """Without atexit handlers (JAX's shutdown barrier would wait for the others); a
  process alone exits normally."""
  exits = []

  def fake_exit(code):
    exits.append(code)
    raise SystemExit(code)
  monkeypatch.setattr(cli.os, "_exit", fake_exit)

  def interrupted(argv):
    del argv
    raise KeyboardInterrupt
  for joined in (True, False):
    monkeypatch.setattr(cli, "_joined_a_job", lambda joined=joined: joined)
    with pytest.raises(SystemExit) as done:
      cli.run(interrupted, flags.FlagValues(), ["prog"], doc="")
    assert done.value.code == 130
  assert exits == [130]  # os._exit only for the process of a job
  assert capsys.readouterr().err == "interrupted\ninterrupted\n"


class _SignalAt(_FailingAt):
  """Scores the step (every 2 steps) and sends SIGINT to this process while evaluating
  `step`."""

  def __init__(self, step):
    super().__init__(step)
    self.broken = False

  def run(self, variables, *, mesh, step):
    if step == self.step:
      signal.raise_signal(signal.SIGINT)
    return super().run(variables, mesh=mesh, step=step)


def test_a_signal_during_an_evaluation(tmp_path, caplog):
  """At step 2 of 4: the evaluation completes, then the run stops with step 2 on disk;
  the re-run signalled during the last evaluation (step 4) finishes the run."""
  config = tiny_config(**{"train.num_steps": 4, "train.checkpoint_every_steps": 2})
  evaluator = _SignalAt(2)
  with pytest.raises(errors.Interrupted) as stopped:
    _trainer(config, tmp_path, {"score": evaluator}).train()
  assert str(stopped.value) == "interrupted at step 2; checkpoint 2 kept; re-run to resume"
  assert stopped.value.exit_code == 130 and evaluator.calls == [2]
  assert _steps(tmp_path / "checkpoints") == [2]
  evaluator = _SignalAt(4)
  state = _trainer(config, tmp_path, {"score": evaluator}).train()
  assert int(state.step) == 4 and evaluator.calls == [4]
  assert _steps(tmp_path / "checkpoints") == [2, 4]
  assert any("SIGINT received during the final evaluation: the run finished" in r.getMessage()
             for r in caplog.records)
