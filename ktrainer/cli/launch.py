"""`ktrainer launch --nodes N -- COMMAND...`: N local worker processes on free 127.0.0.1 ports.

Each worker gets a TF_CONFIG (the TensorFlow engine) and Keras's `KERAS_DISTRIBUTION_*` variables naming
worker 0 as the coordinator (the JAX engine, through jax.distributed).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import IO, Any

__all__ = ["add_parser", "local_cluster"]

PREEMPTED = (128 + signal.SIGTERM, 128 + signal.SIGUSR1)
DRAIN_SECONDS = 10.0  # only reached when a process a worker started outlives it, holding its output open


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def local_cluster(nodes: int) -> list[str]:
    """The TF_CONFIG of each of `nodes` workers on 127.0.0.1, each on a free port."""
    workers = [f"127.0.0.1:{_free_port()}" for _ in range(nodes)]
    return [json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})
            for index in range(nodes)]


class _Output:
    """Copies the workers' output to the launcher's, a whole line at a time, each line prefixed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._readers: list[threading.Thread] = []

    def follow(self, stream: IO[bytes], prefix: str, sink: IO[str]) -> None:
        """Copy every line of `stream` to `sink`, prefixed, until its end (in a thread)."""
        reader = threading.Thread(target=self._copy, args=(stream, prefix.encode(), sink), daemon=True)
        reader.start()
        self._readers.append(reader)

    def say(self, message: str) -> None:
        """Write one line of the launcher's own to its stderr, never inside a worker's line."""
        with self._lock:
            _write(sys.stderr, f"ktrainer launch: {message}\n".encode())

    def drain(self, timeout: float) -> list[int]:
        """Wait until every stream copied has ended; the indices of the readers still open after `timeout`."""
        deadline = time.monotonic() + timeout
        for reader in self._readers:
            reader.join(max(deadline - time.monotonic(), 0.0))
        return [index for index, reader in enumerate(self._readers) if reader.is_alive()]

    def _copy(self, stream: IO[bytes], prefix: bytes, sink: IO[str]) -> None:
        with stream:
            for line in stream:
                # A last line without its newline gets one, so the next line written starts on its own.
                with self._lock:
                    _write(sink, prefix + line if line.endswith(b"\n") else prefix + line + b"\n")


def _write(sink: IO[str], data: bytes) -> None:
    try:
        binary = getattr(sink, "buffer", None)
        if binary is None:  # a text-only stream (e.g. replaced in tests)
            sink.write(data.decode(errors="replace"))
        else:
            sink.flush()
            binary.write(data)
            binary.flush()
        sink.flush()
    except (BrokenPipeError, ValueError):
        pass  # nobody reads the launcher's output any more; the worker's pipe is still drained


@dataclass(frozen=True)
class _Failure:
    index: int
    status: int
    stopped_others: bool

    def describe(self) -> str:
        how = f"exit status {self.status}"
        if self.status < 0:
            how += f" (killed by {_signal_name(-self.status)})"
        return f"worker {self.index} failed with {how}" + ("; stopped the other workers" if self.stopped_others else "")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time signal has no name
        return f"signal {number}"


def _start(command: list[str], nodes: int, output: _Output, processes: list[subprocess.Popen]) -> None:
    """Start the workers into `processes`, each with its TF_CONFIG, its output followed by `output`."""
    configs = local_cluster(nodes)
    coordinator = json.loads(configs[0])["cluster"]["worker"][0]
    for index, config in enumerate(configs):
        # Unbuffered: a worker's lines reach the launcher as printed, and are not lost when it is stopped.
        # TF_CONFIG for the TensorFlow engine; Keras's keras.distribution.initialize variables for the JAX one.
        env = {**os.environ, "TF_CONFIG": config, "PYTHONUNBUFFERED": os.environ.get("PYTHONUNBUFFERED", "1"),
               "KERAS_DISTRIBUTION_JOB_ADDRESSES": coordinator, "KERAS_DISTRIBUTION_NUM_PROCESSES": str(nodes),
               "KERAS_DISTRIBUTION_PROCESS_ID": str(index)}
        try:
            # Own sessions: a signal to the launcher's process group reaches the workers through
            # `forward` only, not twice; and a worker's whole process group can be stopped.
            process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       start_new_session=True)
        except OSError as error:
            raise ValueError(f"launch cannot start {command[0]!r}: {error}") from error
        processes.append(process)
        output.follow(process.stdout, f"[worker {index}] ", sys.stdout)
        output.follow(process.stderr, f"[worker {index}] ", sys.stderr)


def _watch_exits(processes: list[subprocess.Popen]) -> queue.Queue:
    """A queue that receives each worker's index when it exits, fed by one waiting thread per worker."""
    exits: queue.Queue = queue.Queue()

    def wait(index: int, process: subprocess.Popen) -> None:
        process.wait()
        exits.put(index)

    for index, process in enumerate(processes):
        threading.Thread(target=wait, args=(index, process), daemon=True).start()
    return exits


def _stop(processes: list[subprocess.Popen]) -> None:
    """Kill every worker's process group: the worker and whatever it started, so its output ends."""
    for process in processes:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # nothing is left of that group


def _wait_for_all(processes: list[subprocess.Popen], exits: queue.Queue) -> tuple[_Failure | None, int]:
    """Wait until every worker exited: the first failure, if any, and the first preemption status (or 0).
    A worker that fails (other than stopping on a preemption signal) leaves the others waiting in a
    collective forever: they are killed."""
    failure, preempted = None, 0
    for _ in processes:
        index = exits.get()
        status = processes[index].returncode
        if failure is not None or status == 0:
            continue
        if status in PREEMPTED:
            preempted = preempted or status
            continue
        running = any(process.poll() is None for process in processes)
        _stop(processes)
        failure = _Failure(index, status, running)
    return failure, preempted


def add_parser(commands: Any) -> None:
    """Register the `launch` command."""
    parser = commands.add_parser(
        "launch", help="run a command as N local workers of one multi-worker job (for trying it out, and tests)",
        description="Start COMMAND once per node, each with a TF_CONFIG naming all of them on 127.0.0.1, wait "
                    "for all, and exit with the first failure's status. Worker 0 is the chief. Each line a "
                    "worker prints is prefixed with '[worker N] ' (stdout to stdout, stderr to stderr). When a "
                    "worker fails, the others are stopped and the failing worker is named. SIGTERM and "
                    "SIGUSR1 are forwarded to every worker (a preemption notice). Example: "
                    "ktrainer launch --nodes 2 -- ktrainer fit my.py:Module --max-steps 100")
    parser.add_argument("--nodes", type=int, default=2)
    # Not `command`: that is the name of the sub-command in the main parser.
    parser.add_argument("worker_command", nargs=argparse.REMAINDER, metavar="command", help="the command, after --")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Start the workers and wait for them; stop the others when one fails."""
    command = args.worker_command[1:] if args.worker_command[:1] == ["--"] else args.worker_command
    if not command:
        raise ValueError("launch needs a command after --, e.g. ktrainer launch --nodes 2 -- ktrainer fit m.py:M")
    if args.nodes < 1:
        raise ValueError(f"--nodes must be >= 1, got {args.nodes}.")
    processes: list[subprocess.Popen] = []
    output = _Output()

    def forward(signum: int, frame: Any) -> None:  # a preemption notice is for every worker, once
        for process in processes:
            if process.poll() is None:
                process.send_signal(signum)

    previous = {number: signal.signal(number, forward) for number in (signal.SIGTERM, signal.SIGUSR1)}
    interrupted = False
    try:
        _start(command, args.nodes, output, processes)
        failure, preempted = _wait_for_all(processes, _watch_exits(processes))
    except KeyboardInterrupt:  # Ctrl-C reaches the launcher only (the workers have their own sessions)
        interrupted = True
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        _stop(processes)
        for index in output.drain(DRAIN_SECONDS):
            output.say(f"stopped copying worker {index // 2}'s output: a process it started holds it open")
    if interrupted:
        output.say("interrupted; stopped the workers")
        return 128 + signal.SIGINT
    return _report(output, failure, preempted)


def _report(output: _Output, failure: _Failure | None, preempted: int) -> int:
    """Say how the workers ended; the launcher's exit status."""
    if failure is not None:
        output.say(failure.describe())
        return failure.status if failure.status > 0 else 128 - failure.status
    if preempted:
        output.say(f"the workers stopped on a preemption signal (status {preempted})")
    return preempted
