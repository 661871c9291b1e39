"""Shared test setup.

- TRITON_INTERPRET=1 on machines without CUDA, set before anything imports triton, so the Triton
  kernels run (slowly, exactly) on CPU.
- SCALELAB_CACHE points at one temporary directory for the whole session, so the default corpus is
  prepared once per test session and never touches the user's ~/.cache.
- wandb never talks to the network in tests; Ray listens on loopback without token auth; Ray
  Train's controller polls its workers every 0.5 s.
- One OpenMP / BLAS thread per process (torch's intra-op pool, numpy's OpenBLAS, MKL), set before
  either library loads and inherited by every subprocess, Ray worker and spawned rank: the tests'
  problems are tiny, and on a shared 2-core machine a second thread mostly spins against the other
  processes. A value set in the environment wins.
- A process group started by `parallel.backend.spawn` that runs past 180 s is a hang (the longest
  finishes in under 30 s): its ranks' stacks are dumped, it is killed and `SpawnHung` names it; the
  test then reruns once (pyproject.toml), as for a rank killed by a signal.
- The tests on the session's Ray cluster (`ray_local`) run last, together (pytest_collection_modifyitems).
- Tests that start Ray are marked `serial` (by hand; a test on `ray_local` here) and grouped: the
  README's command (`pytest -n 2 --dist loadgroup`) runs them one after another on one xdist worker
  while the other worker runs the rest (the comment above pytest_collection_modifyitems says why).
"""

import os
import sys
import tempfile
from pathlib import Path

# `python -m pytest` from the repository root puts the root on sys.path, where the top-level kernels/
# folder (installed as scalelab.kernels) would shadow the PyPI package `kernels` that transformers
# imports. scalelab is imported through its installed package mapping, never from the root.
_ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _ROOT]

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("SCALELAB_CACHE", tempfile.mkdtemp(prefix="scalelab-test-cache-"))
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("SCALELAB_SPAWN_TIMEOUT_S", "180")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# Ray Train's controller polls its workers every 2 s by default and sees a run's end or a dead worker
# only at a poll; the multi-process runs here last seconds. A poll that outlasts it counts as a
# missed check, not a failure (RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S, 10 min, decides that).
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
# The session's Ray cluster listens on 127.0.0.1 only (as scalelab's own local clusters do, see
# scalelab.sweeps.execution.ray_cluster.local_ray_on_loopback); read by ray when it is imported.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


import pytest  # noqa: E402
from cputime import CpuTime  # noqa: E402


def pytest_addoption(parser):
    group = parser.getgroup("cputime", "CPU time of each test's process tree (tests/cputime.py)")
    group.addoption("--cputime", action="store_true", help="print the tests that used the most CPU seconds")
    group.addoption("--cputime-out", default=None, help="and write every test's CPU and wall seconds here (TSV)")


def pytest_configure(config):
    if config.getoption("--cputime") or config.getoption("--cputime-out"):
        config.pluginmanager.register(CpuTime(config.getoption("--cputime-out")), "cputime")


# A test that starts Ray (a private cluster, a simulated multi-node one, a `scalelab sweep launch`
# subprocess with its own local Ray) carries `@pytest.mark.serial` (or its module's `pytestmark`),
# and every test on the session's cluster (`ray_local`) is marked here: they share one xdist group,
# so `--dist loadgroup` runs them on one worker, one after another: a Ray test uses both cores in
# bursts, and two clusters started side by side would each run at half speed under timing checks
# (hang watchdogs, lease renewals) sized for one. Between the bursts they mostly wait, so the other
# worker runs every other test beside them; the serial group is the largest unit of work, so xdist
# hands it out first, and it is the suite's longest path: nothing joins it that does not start Ray.
# The mark is a test's, not its module's: the other tests of a module with one Ray test
# (test_store_backends' store checks on moto, test_secrets' recorders, test_store_object's leases,
# test_wandb's offline records, test_transfer_gate's spec checks) run on either worker.
# `pytest -m serial` runs the serial tests alone.


def _on_session_ray(item) -> bool:
    return "ray_local" in getattr(item, "fixturenames", ())


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    """Group the serial tests (marked by hand, and any test on the session's Ray cluster, marked
    here); then the tests on the session's Ray cluster last, in their collected order: the first of
    them starts the cluster, which lives until the session ends, so no test that starts a cluster of
    its own comes after it on the serial tests' worker."""
    for item in items:
        if _on_session_ray(item):
            item.add_marker(pytest.mark.serial)
        if item.get_closest_marker("serial"):
            item.add_marker(pytest.mark.xdist_group("serial"))
    items.sort(key=_on_session_ray)


def _grouped(config) -> bool:
    """Whether the xdist controller distributes by group (`--dist loadgroup`): then the serial tests
    share one worker, one after another. A worker's own options say `dist: no`; its main argv does not."""
    argv = getattr(config, "workerinput", {}).get("mainargv", [])
    return "--dist=loadgroup" in argv or any(a == "--dist" and b == "loadgroup" for a, b in zip(argv, argv[1:]))


@pytest.fixture(autouse=True)
def _serial_tests_not_beside_others(request):
    """A serial test on an xdist worker that hands out tests one by one could run beside another
    serial test (two Ray clusters at once); grouped, they share one worker."""
    if (
        os.environ.get("PYTEST_XDIST_WORKER")
        and not _grouped(request.config)
        and request.node.get_closest_marker("serial")
    ):
        pytest.fail("a serial test (it starts Ray: tests/conftest.py) needs --dist loadgroup or no -n")


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module of tiny models (use with pytestmark = usefixtures): on a
    shared 2-core machine that is ~25x faster than two under load; restored after the module."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray cluster for the whole test session (2 CPUs, no dashboard), shut down at the end.

    Started lazily by the first test that asks for it; the workers inherit this process's
    environment (SCALELAB_CACHE, WANDB_MODE, RAY_AUTH_MODE set above). Yields the GCS address so a
    test can point a `scalelab sweep launch --address` subprocess at the same cluster.
    """
    import ray

    started = False
    if not ray.is_initialized():
        # address="local": a private cluster even when another one (`ray start`) runs on this machine
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
        started = True
    yield ray.get_runtime_context().gcs_address
    if started:
        ray.shutdown()
