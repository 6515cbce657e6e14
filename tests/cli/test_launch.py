"""`ktrainer launch`, with real worker processes: a failure stops the others and is named, every line of every
worker arrives whole and prefixed, a preemption notice to the launcher reaches every worker, and only the chief's
loggers create anything."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import ktrainer as kt
from ktrainer.cli.main import main
from tests.checkpoint.test_preemption import Lines

TIMEOUT = 120  # seconds; each run takes a few


def launch(*command: str, nodes: int = 2) -> list[str]:
    """The command line of `ktrainer launch --nodes N -- COMMAND`."""
    return [sys.executable, "-m", "ktrainer.cli.main", "launch", "--nodes", str(nodes), "--", *command]


def run_launch(*command: str, nodes: int = 2) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    return subprocess.run(launch(*command, nodes=nodes), capture_output=True, text=True, env=env, timeout=TIMEOUT)


def gone(pid: int) -> bool:
    """True if the process has ended (a zombie not yet reaped by its new parent has ended too)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


# Worker 0 starts a child that shares its output, says so, then blocks forever; worker 1 waits (on a FIFO, which
# opens once worker 0 has printed) and fails with status 3.
FAILING = textwrap.dedent("""
    import json, os, subprocess, sys, threading
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    fifo = sys.argv[1]
    if index == 0:
        child = subprocess.Popen([sys.executable, "-c", "import threading; threading.Event().wait()"])
        print(f"worker 0 pid {os.getpid()} child {child.pid} blocks", flush=True)
        print("worker 0 on stderr", file=sys.stderr, flush=True)
        with open(fifo, "w"):
            threading.Event().wait()  # blocks until the launcher stops it
    with open(fifo):
        print("worker 1 fails", flush=True)
        print("worker 1 on stderr", file=sys.stderr, flush=True)
        sys.exit(3)
""")


RAISING = textwrap.dedent("""
    import json, os, sys, threading
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    fifo = sys.argv[1]
    if index == 0:
        with open(fifo, "w"):
            threading.Event().wait()  # blocks until the launcher stops it
    with open(fifo):
        raise RuntimeError("the training script broke")
""")


def launch_with_a_fifo(script: str, tmp_path) -> subprocess.CompletedProcess:
    """Launch 2 workers running `script`, which gets the path of a FIFO they meet on."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    return run_launch(sys.executable, "-c", script, str(fifo))


def test_a_worker_that_raises_stops_the_others_and_its_traceback_is_shown(tmp_path):
    result = launch_with_a_fifo(RAISING, tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "ktrainer launch: worker 1 failed with exit status 1; stopped the other workers" in result.stderr
    assert "[worker 1] RuntimeError: the training script broke" in result.stderr.splitlines()


def test_a_failing_worker_stops_the_others_and_is_named(tmp_path):
    result = launch_with_a_fifo(FAILING, tmp_path)
    assert result.returncode == 3, result.stderr[-3000:]
    assert "ktrainer launch: worker 1 failed with exit status 3; stopped the other workers" in result.stderr
    out, err = result.stdout.splitlines(), result.stderr.splitlines()
    assert "[worker 1] worker 1 fails" in out and "[worker 1] worker 1 on stderr" in err
    assert "[worker 0] worker 0 on stderr" in err
    (blocked,) = [line for line in out if line.startswith("[worker 0] ")]
    words = blocked.split()
    assert words[:3] == ["[worker", "0]", "worker"] and words[-1] == "blocks"
    assert gone(int(words[5])) and gone(int(words[7]))  # the worker and the process it started
    assert "stopped copying" not in result.stderr


# Each worker prints 200 numbered lines to stdout and to stderr, one line longer than a pipe's buffer, and a last
# line without its newline.
CHATTY = textwrap.dedent("""
    import json, os, sys
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    for n in range(200):
        print(f"out {index} {n}")
        print(f"err {index} {n}", file=sys.stderr)
    print(str(index) * 100_000)
    print(f"last {index}", end="")
""")


def test_every_line_of_every_worker_arrives_whole_and_prefixed():
    result = run_launch(sys.executable, "-c", CHATTY)
    assert result.returncode == 0, result.stderr[-3000:]
    out, err = result.stdout.splitlines(), result.stderr.splitlines()
    for index in range(2):
        prefix = f"[worker {index}] "
        printed = [f"out {index} {n}" for n in range(200)] + [str(index) * 100_000, f"last {index}"]
        assert [line for line in out if line.startswith(prefix)] == [prefix + line for line in printed]
        assert [line for line in err if line.startswith(prefix)] == [prefix + f"err {index} {n}" for n in range(200)]
    assert len(out) == 2 * 202 and len(err) == 2 * 200  # nothing else, and no line broken or joined


# Each worker stops with status 143 on SIGTERM, as a preempted ktrainer run does.
PREEMPTIBLE = textwrap.dedent("""
    import json, os, signal, sys
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    def stop(signum, frame):
        print(f"worker {index} got signal {signum}", flush=True)
        sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, stop)
    print(f"worker {index} ready", flush=True)
    while True:
        signal.pause()
""")


def test_sigterm_to_the_launcher_reaches_every_worker_once():
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    process = subprocess.Popen(launch(sys.executable, "-c", PREEMPTIBLE), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)
    lines = Lines(process)
    ready = {f"[worker {i}] worker {i} ready" for i in range(2)}
    while ready:
        ready.discard(lines.wait_for(lambda line: line in ready, timeout=TIMEOUT))
    process.send_signal(signal.SIGTERM)
    seen = lines.rest(timeout=TIMEOUT)
    stderr = process.stderr.read()
    assert process.wait(timeout=TIMEOUT) == 143, stderr[-3000:]
    assert "ktrainer launch: the workers stopped on a preemption signal (status 143)" in stderr
    assert sorted(line for line in seen if "got signal" in line) == [
        f"[worker {i}] worker {i} got signal {signal.SIGTERM.value}" for i in range(2)]


def test_nodes_and_the_command_are_checked(capsys):
    assert main(["launch", "--nodes", "0", "--", sys.executable, "-c", "pass"]) == 2
    assert "--nodes must be >= 1, got 0" in capsys.readouterr().err
    assert main(["launch", "--nodes", "2"]) == 2
    assert "launch needs a command after --" in capsys.readouterr().err
    assert main(["launch", "--nodes", "2", "--", "/nonexistent/ktrainer-worker"]) == 2
    assert "launch cannot start '/nonexistent/ktrainer-worker'" in capsys.readouterr().err


def tf_config(index: int) -> str:
    return json.dumps({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"type": "worker",
                                                                                        "index": index}})


@pytest.mark.parametrize("logger_class", [kt.loggers.TensorBoardLogger, kt.loggers.CSVLogger])
def test_outside_the_chief_a_logger_creates_nothing(tmp_path, monkeypatch, logger_class):
    (tmp_path / logger_class().name / "version_0").mkdir(parents=True)  # an earlier run
    monkeypatch.setenv("TF_CONFIG", tf_config(1))
    worker = logger_class(str(tmp_path))
    assert not worker.writes
    worker.log_hyperparams({"lr": 0.1})
    worker.log_metrics({"loss": 1.0}, step=1)
    worker.finalize("success")
    assert worker.log_dir.endswith("version_1")
    assert os.listdir(tmp_path / worker.name) == ["version_0"]

    monkeypatch.setenv("TF_CONFIG", tf_config(0))
    chief = logger_class(str(tmp_path))
    assert chief.writes and chief.version == 1  # the next free number, as in one process
    chief.log_hyperparams({"lr": 0.1})
    chief.log_metrics({"loss": 1.0}, step=1)
    chief.finalize("success")
    assert sorted(os.listdir(tmp_path / chief.name)) == ["version_0", "version_1"]
    assert os.listdir(tmp_path / chief.name / "version_1")
