import os

import pytest
import torch

# torchrun's variables. The in-process DeepSpeed / FSDP baselines fill them in for a one-rank world
# (baselines._common.dist_env_defaults) and leave them set for the life of the process, as a real run
# needs; in a test session they would leak into later tests and into the commands those tests start,
# which then believe they are one rank of a torchrun job.
_DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def _restore_dist_env():
    saved = {k: os.environ.get(k) for k in _DIST_ENV}
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def pytest_configure(config):
    # the CPU's kept MFU peak (superoffload/harness/peak.py) goes to a file of this session, not the user's cache:
    # a test run must neither read a figure kept by other work nor leave one behind
    if "SUPEROFFLOAD_PEAK_CACHE" not in os.environ:
        import tempfile

        os.environ["SUPEROFFLOAD_PEAK_CACHE"] = os.path.join(tempfile.mkdtemp(prefix="so-peak-"), "cpu_peak.json")
        if config.getoption("numprocesses", None):  # the controller of pytest-xdist workers, which inherit it
            _keep_cpu_peaks()
    # a pytest-xdist worker (`make test` runs two) shares the cores with the other: one torch thread each, as every
    # rank of the multi-rank tests has, or the two OpenMP teams spin-wait on each other's cores (an engine test
    # of 7 s alone took 45 s beside the other worker). A test that wants more asks (--threads, set_num_threads).
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)


def _keep_cpu_peaks() -> None:
    """Measure and keep the session's CPU peaks (the MFU denominator of every run record) for the dtypes and
    thread counts the tests' runs use, before the workers start. A figure measured while other processes load
    the machine is not kept (superoffload/harness/peak.py), and beside a second worker it always is loaded: then
    every run process measured it again (0.8 s for fp32, 1.5 s for bf16; 12 s for bf16 before the probe was
    sized). Kept regardless of load here: in a test run it only divides."""
    from superoffload.harness import peak

    saved = torch.get_num_threads()
    try:
        for threads in sorted({1, min(2, os.cpu_count() or 1)}):
            torch.set_num_threads(threads)
            for dtype in (torch.float32, torch.bfloat16):
                peak.store_cpu_peak(dtype, threads, peak.measure_cpu_peak_flops(dtype, threads), "test-session")
    finally:
        torch.set_num_threads(saved)


# The suite's unit of work under pytest-xdist (`make test` runs `--dist loadscope`): a worker takes a whole test
# module, so a module-scoped fixture is computed once. Modules that share a session-scoped fixture or a
# process-level cache are one unit, or each worker computes it: the two that share the smoke sweep's run
# (tests/workflow/conftest.py), and the planner modules that compute the paper's multi-chip rows (the session
# fixture in tests/planner/conftest.py) and Fig 12 (cached per process in superoffload.planner.paper), each
# most of a minute. (A scheduler of our own rather than xdist_group marks: `--dist loadgroup` ignores them
# under pytest 9.2, pytest-xdist #1386.)
SMOKE_SWEEP_MODULES = ("tests/workflow/test_e2e.py", "tests/workflow/test_report_browser.py")
SHARED_UNITS = {
    **{m: "smoke_sweep" for m in SMOKE_SWEEP_MODULES},
    **{f"tests/planner/{m}.py": "planner_paper_rows" for m in ("test_paper", "test_planner_chips", "test_long_seq")},
}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return SHARED_UNITS.get(module, module)

    return ModuleScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
