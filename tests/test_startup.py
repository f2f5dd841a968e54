"""The start-up figures of a run (summary.json's run.timing ``startup`` and ``startup_<phase>``): they
cover the time from the process's start to the first batch, phase by phase, on one process and on
a Dask cluster; and the clock's parts (phases, the listing started ahead)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import eval_argv
from pipeline_toy import ToyReconstructor, ToySpec
from xmesh import cli
from xmesh.errors import MissingFileError
from xmesh.evaluate import evaluate_dataset
from xmesh.pipeline import startup
from xmesh.synthetic.dataset import write_dataset

TESTS = Path(__file__).resolve().parent
SLOW_BUILD_S = 3.0
# the command below: the model build slowed by SLOW_BUILD_S, and the process's age (the kernel's
# clock, not the start-up clock's) written down when the batch loop is entered
COMMAND = """
import json, sys, time
sys.path.insert(0, {tests!r})
from pipeline_toy import ToyReconstructor
import xmesh.commands.common as common
import xmesh.pipeline.executor as executor
from xmesh.pipeline import startup
from xmesh import cli

def slow_build(args):
    time.sleep({delay})
    return ToyReconstructor()

def first_batch_seen(*a, **k):
    json.dump({{"age": startup.process_age()}}, open({seen!r}, "w"))
    return loop(*a, **k)

loop = executor.run_batches
common.reconstructor_from_args = slow_build
executor.run_batches = first_batch_seen
{run}
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("ds"), n_per_category=1, seed=3)


def _startup(timing: dict) -> dict:
    return {k: v for k, v in timing.items() if k.startswith(startup.PREFIX)}


def _check_sums(timing: dict) -> None:
    phases = _startup(timing)
    assert set(phases) == {startup.PREFIX + p for p in startup.PHASES}
    assert all(v >= 0.0 for v in phases.values()) and timing["startup"] > 0.0
    assert sum(phases.values()) == pytest.approx(timing["startup"], rel=1e-9, abs=1e-9)


def test_a_command_accounts_for_every_second_before_its_first_batch_and_a_slow_build_shows(data, tmp_path):
    """`xmesh eval` in a fresh process, its model build slowed by 3 s: the phases add up to the start-up,
    which is the process's age when the batch loop starts (to the kernel's 10 ms clock tick, plus the
    few instructions between the two readings), and the model phase is the largest, >= the 3 s slept."""
    seen = tmp_path / "seen.json"
    out = tmp_path / "out"
    argv = eval_argv(data, out, "--workers", "0", "--batch-size", "2")
    code = COMMAND.format(tests=str(TESTS), delay=SLOW_BUILD_S, seen=str(seen), run=f"sys.exit(cli.main({argv!r}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    timing = json.loads((out / "summary.json").read_text())["run"]["timing"]
    _check_sums(timing)
    age_at_first_batch = json.loads(seen.read_text())["age"]
    assert timing["startup"] == pytest.approx(age_at_first_batch, abs=0.05)
    phases = _startup(timing)
    assert max(phases, key=phases.get) == startup.PREFIX + "model"
    assert phases[startup.PREFIX + "model"] >= SLOW_BUILD_S
    assert phases[startup.PREFIX + "import"] > 0.0 and phases[startup.PREFIX + "cluster"] == 0.0
    assert "start-up " in proc.stdout and "to the first batch" in proc.stdout


def test_the_xmesh_command_ends_with_the_runs_status_and_every_output_written(data, tmp_path):
    """`xmesh eval` as the console script runs it (``cli.command``, which ends the process without the
    interpreter's clean-up): its printed summary, samples.csv and summary.json are all there, and a
    refused run still ends with status 2 and its one-line error."""
    out = tmp_path / "out"
    argv = ["xmesh", *eval_argv(data, out, "--workers", "1")]
    run = f"sys.argv[:] = {argv!r}\ncli.command()"
    code = COMMAND.format(tests=str(TESTS), delay=0.0, seen=str(tmp_path / "seen.json"), run=run)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "to the first batch" in proc.stdout and proc.stdout.endswith("\n")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["samples"] == len(data["ids"]) and (out / "f_score.log").exists()
    assert proc.stderr.count("\n") <= 2 and "Traceback" not in proc.stderr, proc.stderr
    refused = run.replace(str(data["test_list"]), str(tmp_path / "missing.txt"))
    proc = subprocess.run(
        [sys.executable, "-c", COMMAND.format(tests=str(TESTS), delay=0.0, seen="", run=refused)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("xmesh eval: error:") and "missing.txt" in proc.stderr


def test_a_library_call_counts_from_the_call(data, tmp_path):
    """evaluate_dataset called from Python: the clock starts at the call (nothing for import or model)."""
    before = time.perf_counter()
    summary = evaluate_dataset(
        ToyReconstructor(),
        data["test_list"],
        data["root"],
        data["root"] / "gt",
        tmp_path / "out",
        batch_size=2,
        workers=0,
        progress=False,
    )
    timing = summary["run"]["timing"]
    _check_sums(timing)
    assert timing["startup"] <= time.perf_counter() - before
    assert timing[startup.PREFIX + "import"] == 0.0 and timing[startup.PREFIX + "model"] == 0.0
    assert timing[startup.PREFIX + "listing"] > 0.0


def test_a_cluster_run_counts_its_workers_set_up(data, tmp_path):
    """On a 2-process local cluster started without the model: the ``workers`` phase lasts until the
    first worker is ready, at least that worker's build as it reports it (its plugin, registered by
    the run, starts the build)."""
    from xmesh.cluster import open_client

    with open_client("local:2") as client:
        summary = evaluate_dataset(
            ToySpec(),
            data["test_list"],
            data["root"],
            data["root"] / "gt",
            tmp_path / "out",
            batch_size=1,
            workers=0,
            progress=False,
            client=client,
        )
    timing = summary["run"]["timing"]
    _check_sums(timing)
    prepared = summary["run"]["cluster"]["prepared"]
    assert 1 <= len(prepared) <= 2 and all(w["peers"] == 2 for w in prepared)
    assert timing[startup.PREFIX + "workers"] >= prepared[0]["model_s"]  # in the order they became ready
    assert timing[startup.FINISH] >= 0.0


class _Stop(Exception):
    """Ends a command at its listing's start, once the test has seen what came before."""


@pytest.mark.parametrize(
    "extra, starts_driver",
    [
        (["--backend", "cupy"], True),
        (["--backend", "numpy"], False),
        (["--backend", "cupy", "--cluster", "local-cuda"], False),
    ],
)
def test_a_gpu_command_starts_cudas_driver_before_its_listing_and_a_clusters_client_does_not(
    data, tmp_path, monkeypatch, extra, starts_driver
):
    from xmesh.backends import cuda_driver

    calls = []
    monkeypatch.setattr(cuda_driver, "start_driver", lambda: calls.append("driver"))

    def listing(*args):
        calls.append("listing")
        raise _Stop

    monkeypatch.setattr(startup, "prefetch", listing)
    argv = eval_argv(data, tmp_path / "out", *extra)
    with pytest.raises(_Stop):
        cli.main(argv)
    assert calls == (["driver", "listing"] if starts_driver else ["listing"])


SLOW_LOGS_S = 0.4


def test_the_seconds_after_the_last_batch_are_the_runs_finish(data, tmp_path, monkeypatch):
    """run.timing's ``finish``: from the last batch to the summary written; the logs written slowly by
    0.4 s show there, and start-up + pipeline + finish fit in the call's own time."""
    import xmesh.results.store as store

    write_logs = store.write_logs

    def slow_logs(*args):
        time.sleep(SLOW_LOGS_S)
        write_logs(*args)

    monkeypatch.setattr(store, "write_logs", slow_logs)
    before = time.perf_counter()
    summary = evaluate_dataset(
        ToyReconstructor(),
        data["test_list"],
        data["root"],
        data["root"] / "gt",
        tmp_path / "out",
        batch_size=2,
        workers=0,
        progress=False,
    )
    took = time.perf_counter() - before
    timing = summary["run"]["timing"]
    assert timing[startup.FINISH] >= SLOW_LOGS_S
    assert timing["startup"] + timing["wall"] + timing[startup.FINISH] <= took
    written = json.loads((tmp_path / "out" / "summary.json").read_text())["run"]["timing"]
    assert written[startup.FINISH] == timing[startup.FINISH]
    assert "from the last batch to the outputs written" in startup.format_startup(timing)


def test_the_clock_gives_each_stretch_to_the_phase_marked_at_its_end():
    clock = startup.StartupClock()
    time.sleep(0.02)
    clock.mark("listing")
    clock.mark("model")
    time.sleep(0.01)
    clock.mark("listing")
    figures = clock.first_batch()
    assert figures[startup.PREFIX + "listing"] >= 0.03
    assert figures[startup.PREFIX + "listing"] > figures[startup.PREFIX + "model"]
    assert figures["startup"] == pytest.approx(sum(v for k, v in figures.items() if k != "startup"))
    assert clock.first_batch() == figures  # closed: a second call changes nothing


def test_a_prefetched_listing_is_taken_once_and_its_error_raised_where_taken(tmp_path):
    calls = []

    def listing(name):
        calls.append(name)
        if name == "bad":
            raise MissingFileError(f"{name}: absent")
        return name.upper()

    startup.prefetch(listing, "a")
    startup.prefetch(listing, "bad")
    assert startup.take(listing, "a") == "A"
    with pytest.raises(MissingFileError, match="bad: absent"):
        startup.take(listing, "bad")
    assert startup.take(listing, "a") == "A"  # not prefetched any more: computed here
    assert sorted(calls) == ["a", "a", "bad"]


def test_the_process_start_lies_before_now_and_after_the_boot():
    age = startup.process_age()
    if age is None:
        pytest.skip("no /proc/self/stat here: the clock counts from xmesh.cli's import")
    boot = time.clock_gettime(time.CLOCK_BOOTTIME)
    assert 0.0 <= age <= boot
    assert startup.process_start() <= time.perf_counter() - age + 0.02


def test_a_library_call_after_a_command_in_the_same_process_starts_its_own_clock(data, tmp_path):
    """A command that runs no dataset (here one that fails) leaves no clock behind for a later call."""
    assert (
        cli.main(
            [
                "eval",
                "--images",
                str(tmp_path / "absent"),
                "--gt",
                str(tmp_path),
                "--list",
                str(data["test_list"]),
                "--weights",
                "synthetic:1",
                "--out",
                str(tmp_path / "e"),
            ]
        )
        == 2
    )
    time.sleep(0.3)
    before = time.perf_counter()
    summary = evaluate_dataset(
        ToyReconstructor(),
        data["test_list"],
        data["root"],
        data["root"] / "gt",
        tmp_path / "out",
        batch_size=2,
        workers=0,
        progress=False,
    )
    assert summary["run"]["timing"]["startup"] <= time.perf_counter() - before
