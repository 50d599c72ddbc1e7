"""Malformed magic lines are UsageErrors with a helpful message, and start nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from tests.support.processes import worker_kernels
from tfdist_nb import current


@pytest.fixture(scope="module")
def ip() -> Iterator[Any]:
    shell = InteractiveShell.instance()
    shell.extension_manager.load_extension("tfdist_nb")
    yield shell
    shell.extension_manager.unload_extension("tfdist_nb")


BAD_LINES = [
    ("two workers", "expected a number before 'workers'"),
    ("0 workers", "0 workers is not a cluster"),
    ("2 wrokers", "Did you mean 'workers'"),
    ("2", "pairs of '<count> <role>'"),
    ("2 workers --bogus", "unrecognized arguments: --bogus"),
    ("2 workers --env NOEQUALS", "--env expects KEY=VALUE"),
    ("2 workers --env 1BAD=x", "--env expects KEY=VALUE"),
    ("2 workers --env TF_CONFIG={}", "--env TF_CONFIG=... cannot be set: each task's TF_CONFIG"),
    ("2 workers --env TFDIST_TASK=worker:0", "--env TFDIST_TASK=... cannot be set"),
    ("2 workers --on worker:7", "no task worker:7 in a cluster of 2 workers"),
    ("2 workers --on gpu:1", "cannot read task 'gpu:1'"),
    ("2 workers --timeout -5", "--timeout must be a positive number"),
    ("2 workers --timeout soon", "invalid float value: 'soon'"),
    ("2 workers --python /no/such/python", "not found"),
    ("2 workers --launcher nomad", "unknown launcher 'nomad'"),
    ("2 workers --launcher sshh", "unknown launcher 'sshh' (did you mean 'ssh'?)"),
    ("2 workers --net lan", "--net: choose auto, private, host, not 'lan'"),
    ("2 workers --launcher local --sbatch '--nodes=2'", "--sbatch needs --launcher slurm"),
    ("2 workers --sbatch '--ntasks=4'", "sbatch option '--ntasks=4' is not allowed: the "
                                        "cluster's SPEC sets the number of tasks"),
    ("2 workers --sbatch '-o /tmp/x.out'", "sbatch option '-o' is not allowed"),
    ("2 workers --launcher slurm --hosts a,b", "--hosts needs --launcher ssh"),
    ("2 workers --hosts a,b --launcher local", "--hosts needs --launcher ssh"),
    ("2 workers --launcher ssh", "--launcher ssh needs --hosts"),
    ("2 workers --hosts ,", "--hosts needs at least one host"),
    ("2 workers --launcher attach", "--launcher attach and --connection-dir DIR go together"),
    ("2 workers --connection-dir /nonexistent/tfdist-typo",
     "--connection-dir /nonexistent/tfdist-typo is not a directory: start the workers first"),
    ("2 workers --env 'A=1", "cannot read the line"),
    ("", "no cluster is running and no SPEC was given"),
    ("1 chief 2 chiefs", "given twice"),
]


def test_a_typo_gets_its_fix_alone_and_a_line_it_cannot_read_gets_the_examples(
        ip: Any) -> None:
    with pytest.raises(UsageError) as typo:
        ip.run_cell_magic("tfcluster", "2 workers --launcher sshh", "x = 1")
    assert str(typo.value) == ("unknown launcher 'sshh' (did you mean 'ssh'?); choose one of "
                               "attach, local, ray, slurm, ssh")
    with pytest.raises(UsageError) as role:  # one line: its own example, no block of six
        ip.run_cell_magic("tfcluster", "2 wrkers", "x = 1")
    assert str(role.value) == (
        "unknown role 'wrkers'; roles are chief, worker(s), ps, evaluator. Did you mean "
        "'workers'? Example: %%tfcluster 2 workers   (or: 1 worker, 1 chief 2 workers 1 ps)")
    with pytest.raises(UsageError) as flag:
        ip.run_cell_magic("tfcluster", "2 workers --tiemout 5", "x = 1")
    assert str(flag.value) == "unrecognized arguments: --tiemout 5; did you mean --timeout?"
    with pytest.raises(UsageError) as unread:
        ip.run_cell_magic("tfcluster", "2 workers --env 'A=1", "x = 1")
    assert "examples:\n  %%tfcluster 2 workers\n" in str(unread.value)


@pytest.mark.parametrize(("line", "needle"), BAD_LINES)
def test_bad_line_is_usage_error_and_starts_nothing(ip: Any, line: str, needle: str) -> None:
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    workers = worker_kernels()
    with pytest.raises(UsageError) as info:
        ip.run_cell_magic("tfcluster", line, "print('never runs')")
    message = str(info.value)
    assert needle in message
    # every message carries an example, or is one: it names the fix (a typo's closest word,
    # the values to choose from, an e.g.)
    assert "%%tfcluster 2 workers" in message or any(
        words in message.lower() for words in ("did you mean", "e.g.", "choose ")), message
    assert current() is None
    assert worker_kernels() == workers
    assert {p.pid for p in psutil.Process().children(recursive=True)} == children


def test_line_form_is_checked_the_same_way(ip: Any) -> None:
    with pytest.raises(UsageError, match="Did you mean 'workers'"):
        ip.run_line_magic("tfcluster", "2 wrokers")


@pytest.mark.parametrize("magic", ["tfdist_status", "tfdist_logs", "tfdist_env",
                                   "tfdist_restart", "tfdist_interrupt", "tfdist_debug"])
def test_magics_need_a_cluster(ip: Any, magic: str) -> None:
    with pytest.raises(UsageError, match="no cluster is running"):
        ip.run_line_magic(magic, "")


def test_report_takes_its_documented_show_env_flag(ip: Any, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """--show-env was declared after the parser was built and refused as unrecognized: the
    line parses and the magic goes on to look for a cluster (none, whatever ran before in this
    process: the suite's earlier tests)."""
    from tfdist_nb.magics import common

    monkeypatch.setattr(common, "last_cluster", lambda: None)
    monkeypatch.setattr(common, "current", lambda: None)
    with pytest.raises(UsageError, match="no cluster has run here yet"):
        ip.run_line_magic("tfdist_report", f"--show-env {tmp_path / 'issue'}")
    assert not (tmp_path / "issue").exists()


def test_stop_without_cluster_says_so(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("tfdist_stop", "")
    assert "no cluster is running" in capsys.readouterr().out


def test_help_is_complete(ip: Any) -> None:
    doc = ip.find_cell_magic("tfcluster").__doc__
    for option in ("--on", "--env", "--timeout", "--stall-timeout", "--restart", "--python",
                   "--hosts", "--launcher", "resized: 2 workers -> 1 worker", "Examples"):
        assert option in doc


@pytest.mark.cluster
def test_a_refused_host_is_a_usage_error_and_keeps_the_running_cluster(ip: Any) -> None:
    """A line whose launcher refuses its arguments fails before the running cluster stops."""
    ip.run_cell_magic("tfcluster", "1 worker", "x = 1")
    running = current()
    assert running is not None
    with pytest.raises(UsageError, match="starts with '-'") as info:
        ip.run_cell_magic("tfcluster", "1 worker --hosts=-oProxyCommand=true", "x = 1")
    assert "%%tfcluster" in str(info.value)  # the usage example
    assert current() is running and running.running
    # a typo in the directory of workers to attach: at once, not after the 120 s wait
    started = time.monotonic()
    with pytest.raises(UsageError, match="--connection-dir /nonexistent/typo is not a dir"):
        ip.run_cell_magic("tfcluster", "1 worker --connection-dir /nonexistent/typo", "x = 1")
    assert time.monotonic() - started < 30  # no wait for workers that never come
    assert current() is running and running.running and running.run("x").ok
    ip.run_line_magic("tfdist_stop", "")


def test_check_magic_without_a_cluster_checks_a_given_tf_config(ip: Any) -> None:
    ip.user_ns["cfg"] = {"cluster": {"worker": ["localhost:2222", "localhost:2222"]},
                         "task": {"type": "worker", "index": 0}}
    report = ip.run_line_magic("tfdist_check", "tfconfig cfg")
    assert not report.ok and "duplicate address localhost:2222" in report.summary
    with pytest.raises(UsageError, match="unknown check 'sharing'"):
        ip.run_line_magic("tfdist_check", "sharing")
    with pytest.raises(UsageError, match="no cluster is running"):
        ip.run_line_magic("tfdist_check", "network")


BAD_NUMBERS = [
    ("tfdist_logs", "--tail 0", "argument --tail: '0': must be a finite number at least 1"),
    ("tfdist_check", "sharding ds --max-seconds inf", "'inf': must be a finite number above 0"),
    ("tfdist_check", "variables v --atol -1", "'-1': must be a finite number at least 0"),
    ("tfdist_inject", "oom --limit-mb -5", "'-5': must be a finite number above 0"),
    ("tfdist_inject", "straggler --seconds nan", "'nan': must be a finite number above 0"),
    ("tfdist_profile", "--duration-ms 0", "'0': must be a finite number at least 1"),
    ("tfdist_collectives", "--last many", "'many' is not a number"),
    ("tfdist_isolate", "--budget-s inf", "'inf': must be a finite number above 0"),
    ("tfdist_isolate", "--cell 0", "'0': must be a finite number at least 1"),
]


@pytest.mark.parametrize(("magic", "line", "needle"), BAD_NUMBERS)
def test_numbers_out_of_range_are_usage_errors_before_anything_runs(
        ip: Any, magic: str, line: str, needle: str) -> None:
    """Read when the line is parsed: no cluster is needed to be told, and none is touched."""
    with pytest.raises(UsageError, match=needle):
        ip.run_line_magic(magic, line)


@pytest.mark.cluster
def test_bad_paths_and_log_options_are_usage_errors_and_save_is_owner_only(
        ip: Any, tmp_path: Any) -> None:
    """A regular expression that does not compile, a tail that is not a count of lines, and a
    --save path that cannot be written are UsageErrors saying which; a saved log is 0600."""
    import os
    import stat

    ip.run_cell_magic("tfcluster", "1 worker", "print('one line')")
    try:
        for line, needle in [("--grep (", "is not a regular expression"),
                             ("--tail 0", "argument --tail: '0': must be a finite number"),
                             ("--tail -2", "argument --tail: '-2': must be a finite number"),
                             (f"--save {tmp_path}/no/such/dir/x.jsonl",
                              "--save: cannot write")]:
            with pytest.raises(UsageError, match=needle) as info:
                ip.run_line_magic("tfdist_logs", line)
            assert "example: %tfdist_logs" in str(info.value), line
        in_the_way = tmp_path / "a-file"
        in_the_way.write_text("not a directory")
        for magic, line, needle in [
                ("tfdist_profile", f"--logdir {in_the_way}/x", "--logdir .*cannot make this"),
                ("tfdist_numerics", f"on --dump {in_the_way}", "--dump .*cannot make this")]:
            with pytest.raises(UsageError, match=needle):
                ip.run_line_magic(magic, line)
        saved = tmp_path / "logs.jsonl"
        df = ip.run_line_magic("tfdist_logs", f"--tail 1 --grep 'one line' --save {saved}")
        assert list(df["text"]) == ["one line"]
        assert "one line" in saved.read_text()
        assert stat.S_IMODE(os.stat(saved).st_mode) == 0o600
    finally:
        ip.run_line_magic("tfdist_stop", "")


@pytest.mark.parametrize("value", ["0", "-1", "fast", "inf"])
def test_a_telemetry_interval_that_would_starve_the_tasks_is_refused_up_front(
        monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """It used to make every start wait for start_timeout (a telemetry thread that never
    sleeps); now the cluster is not even made, and nothing starts."""
    from tfdist_nb import Cluster
    from tfdist_nb.errors import SpecError

    monkeypatch.setenv("TFDIST_TELEMETRY_INTERVAL", value)
    workers = worker_kernels()
    with pytest.raises(SpecError, match=r"TFDIST_TELEMETRY_INTERVAL=.*at least 0\.05"):
        Cluster(workers=1)
    assert worker_kernels() == workers


@pytest.mark.cluster
def test_a_dead_task_is_answered_with_advice_by_every_magic_that_acts_on_it(ip: Any) -> None:
    """One error wrapper for all magics: a dead task is a UsageError saying how to bring it
    back (it escaped as a raw ClusterNotRunningError from %tfdist_env and %tfdist_loglevel)."""
    import os
    import signal

    from tests.support.processes import wait_for

    ip.run_line_magic("tfcluster", "1 worker --no-dashboard --no-warm")
    cluster = current()
    try:
        (rt,) = cluster.tasks.values()
        os.kill(rt.pid, signal.SIGKILL)
        wait_for(lambda: rt.state.value == "dead", 10, "worker:0 dead")
        for name, line in [("tfdist_env", ""), ("tfdist_loglevel", "INFO"),
                           ("tfdist_inject", "straggler --on 0"), ("tfdist_numerics", "on"),
                           ("tfdist_profile", "--now --duration-ms 100"),
                           ("tfdist_check", "env")]:
            with pytest.raises(UsageError) as err:
                ip.run_line_magic(name, line)
            said = str(err.value)
            assert "worker:0 is dead; bring it back with %tfdist_restart" in said, (name, said)
            assert "example: %" in said, (name, said)
    finally:
        cluster.stop()


def test_native_windows_is_refused_with_the_wsl2_pointer(
        ip: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """No Windows machine here: the platform seam is forced. %load_ext and Cluster() say what
    to do instead of failing later on os.fchmod or AF_UNIX with an AttributeError."""
    import sys

    import tfdist_nb
    from tfdist_nb import Cluster
    from tfdist_nb.errors import SpecError

    monkeypatch.setattr(sys, "platform", "win32")
    with pytest.raises(UsageError, match=r"not on native Windows .*install WSL2 \(wsl --install\)"):
        tfdist_nb.load_ipython_extension(ip)
    with pytest.raises(SpecError, match="install WSL2"):
        Cluster(workers=2)
