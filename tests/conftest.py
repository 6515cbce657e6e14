"""Shared fixtures: quiet Trainer settings and a real S3 server (moto) on 127.0.0.1."""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

ON_JAX = os.environ["KERAS_BACKEND"] == "jax"
if ON_JAX:  # the logical devices the multi-device tests ask for, before JAX starts (as TensorFlow's are)
    import jax

    jax.config.update("jax_num_cpu_devices", 8)


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


def pytest_unconfigure(config):
    """Stop a JAX session still running (the TensorFlow session ended early) and remove its files."""
    from tests.backends.jax_session import STASH

    if STASH in config.stash:
        config.stash[STASH].close()


@pytest.fixture(autouse=True)
def _run_in_a_temporary_folder(tmp_path, monkeypatch):
    """Tests that write to the default root (".") write into their own temporary folder."""
    monkeypatch.chdir(tmp_path)


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


@pytest.fixture
def s3_bucket(s3_server, request):
    """A fresh bucket; returns (root URL, storage_options)."""
    import s3fs

    options = {"client_kwargs": {"endpoint_url": s3_server}, "key": "testing", "secret": "testing"}
    fs = s3fs.S3FileSystem(**options)
    name = "ktrainer-" + request.node.name.lower().replace("_", "-")[:40].strip("-")
    fs.mkdir(name)
    yield f"s3://{name}", options
    fs.rm(name, recursive=True)
