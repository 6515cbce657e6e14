"""`ktrainer launch --nodes N -- COMMAND...`: N local worker processes with TF_CONFIG on free 127.0.0.1 ports."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

__all__ = ["add_parser", "local_cluster"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def local_cluster(nodes: int) -> list[str]:
    """The TF_CONFIG of each of `nodes` workers on 127.0.0.1, each on a free port."""
    workers = [f"127.0.0.1:{_free_port()}" for _ in range(nodes)]
    return [json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})
            for index in range(nodes)]


def _wait_for_all(processes: list[subprocess.Popen]) -> int:
    """Wait until every worker exited; the first failure's status. A worker that fails (other than stopping on
    a preemption signal) leaves the others waiting in a collective forever: they are killed."""
    preempted = (128 + signal.SIGTERM, 128 + signal.SIGUSR1)
    status = 0
    while any(process.poll() is None for process in processes):
        for process in processes:
            code = process.poll()
            if code is None or code == 0 or status:
                continue
            status = code
            if code not in preempted:
                for other in processes:
                    if other.poll() is None:
                        other.kill()
        time.sleep(0.1)  # a poll interval while workers run
    for process in processes:
        if status == 0 and process.returncode:
            status = process.returncode
    return status


def add_parser(commands: Any) -> None:
    """Register the `launch` command."""
    parser = commands.add_parser(
        "launch", help="run a command as N local workers of one multi-worker job (for trying it out, and tests)",
        description="Start COMMAND once per node, each with a TF_CONFIG naming all of them on 127.0.0.1, wait "
                    "for all, and exit with the first failure's status. Worker 0 is the chief. SIGTERM and "
                    "SIGUSR1 are forwarded to every worker (a preemption notice). Example: "
                    "ktrainer launch --nodes 2 -- ktrainer fit my.py:Module --max-steps 100")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Start the workers and wait for them; stop the others when one fails."""
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise ValueError("launch needs a command after --, e.g. ktrainer launch --nodes 2 -- ktrainer fit m.py:M")
    if args.nodes < 1:
        raise ValueError(f"--nodes must be >= 1, got {args.nodes}.")
    processes: list[subprocess.Popen] = []

    def forward(signum: int, frame: Any) -> None:  # a preemption notice is for every worker, once
        for process in processes:
            if process.poll() is None:
                process.send_signal(signum)

    previous = {number: signal.signal(number, forward) for number in (signal.SIGTERM, signal.SIGUSR1)}
    status = 0
    try:
        for config in local_cluster(args.nodes):
            # Own sessions: a signal to the launcher's process group reaches the workers through
            # `forward` only, not twice.
            processes.append(subprocess.Popen(command, env={**os.environ, "TF_CONFIG": config},
                                              start_new_session=True))
        status = _wait_for_all(processes)
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        for process in processes:
            if process.poll() is None:
                process.kill()
    if status in (128 + signal.SIGTERM, 128 + signal.SIGUSR1):
        print(f"ktrainer launch: the workers stopped on a preemption signal (status {status})", file=sys.stderr)
    elif status:
        print(f"ktrainer launch: a worker failed with status {status}", file=sys.stderr)
    return status
