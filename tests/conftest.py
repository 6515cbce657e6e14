"""Shared fixtures: quiet Trainer settings, a real S3 server (moto) and a GCS server (the emulator) on 127.0.0.1,
and slow processes started as collection ends (tests/early.py)."""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

ON_JAX = os.environ["KERAS_BACKEND"] == "jax"
if ON_JAX:  # the logical devices the multi-device tests ask for, before JAX starts (as TensorFlow's are)
    import jax

    jax.config.update("jax_num_cpu_devices", 8)


def pytest_configure(config):
    """Register the `starts_early` mark (tests/early.py)."""
    from tests.early import MARK

    config.addinivalue_line("markers", MARK)


def pytest_collection_modifyitems(config, items):
    """On TensorFlow, start the JAX session beside this one and check its results last; on JAX (that session),
    run only the promises both engines keep and the JAX engine's own tests. tests/backends/jax_session.py says more."""
    if ON_JAX:
        kept = [item for item in items if item.get_closest_marker("jax_only") or (
            item.get_closest_marker("both_backends") and not item.get_closest_marker("tensorflow_only"))]
    else:
        kept = [item for item in items if not item.get_closest_marker("jax_only")]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept
    if ON_JAX:
        return
    on_jax = [item for item in items if item.path.name == "test_shared_on_jax.py"]
    if on_jax:
        from tests.backends.jax_session import STASH, JaxSession

        items[:] = [item for item in items if item not in on_jax] + on_jax
        config.stash[STASH] = JaxSession()


def pytest_collection_finish(session):
    """Start the slow processes that the tests left to run (-k and -m applied) are marked `starts_early` with."""
    from tests.early import start_marked

    start_marked(session.config, session.items)


def pytest_unconfigure(config):
    """Stop a JAX session or an early start still running (the session ended early) and remove their files."""
    from tests.backends.jax_session import STASH
    from tests.early import STASH as EARLY

    for key in (STASH, EARLY):
        if key in config.stash:
            config.stash[key].close()


@pytest.fixture(autouse=True)
def _run_in_a_temporary_folder(tmp_path, monkeypatch):
    """Tests that write to the default root (".") write into their own temporary folder."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="session")
def started(pytestconfig):
    """`started(start)`: what `start` (a `starts_early` mark's) began, as collection ended (tests/early.py)."""
    from tests.early import starts

    return starts(pytestconfig).start


@pytest.fixture
def quiet() -> dict:
    """Trainer keyword arguments for a test: no progress bar, no logger."""
    return {"enable_progress_bar": False, "logger": False}


@pytest.fixture(scope="session")
def s3_server():
    """A real S3-compatible server (moto) on 127.0.0.1, with dummy credentials in the environment."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request drowns a failure's report

    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        os.environ.setdefault(name, value)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(scope="session")
def gcs_server():
    """A real GCS-compatible server (gcp-storage-emulator, in memory, in this process) on 127.0.0.1."""
    import socket

    from gcp_storage_emulator.server import create_server

    # Newer gcsfs otherwise asks each bucket for its layout over gRPC, which the emulator lacks, and waits 60 s.
    os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
    with socket.socket() as probe:  # a free port: the emulator does not report one it picked itself
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = create_server("127.0.0.1", port, in_memory=True)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def gcs_bucket(gcs_server, request):
    """A fresh bucket on the GCS emulator; returns (root URL, storage_options)."""
    import gcsfs

    options = {"endpoint_url": gcs_server, "token": "anon"}
    fs = gcsfs.GCSFileSystem(**options)
    name = "ktrainer-" + request.node.name.lower().replace("_", "-").replace("[", "-").replace("]", "")[:40].strip("-")
    fs.mkdir(name)
    yield f"gs://{name}", options
    fs.rm(name, recursive=True)


@pytest.fixture(params=["s3", "gcs"])
def cloud_bucket(request):
    """A fresh bucket on S3 (moto) and, in a second run of the test, on GCS (the emulator): (root URL, options)."""
    return request.getfixturevalue(f"{request.param}_bucket")


@pytest.fixture
def s3_bucket(s3_server, request):
    """A fresh bucket; returns (root URL, storage_options)."""
    import s3fs

    options = {"client_kwargs": {"endpoint_url": s3_server}, "key": "testing", "secret": "testing"}
    fs = s3fs.S3FileSystem(**options)
    name = "ktrainer-" + request.node.name.lower().replace("_", "-").replace("[", "-").replace("]", "")[:40].strip("-")
    fs.mkdir(name)
    yield f"s3://{name}", options
    fs.rm(name, recursive=True)
