"""The seconds from a command's start to its first batch, by phase (summary.json's ``run.timing``).

A :class:`StartupClock` starts when the process started (read from ``/proc/self/stat``; elsewhere,
when this module was first imported, which ``xmesh.cli`` does first) and gives each stretch of time
to the phase that :meth:`~StartupClock.mark` names at its end, so the phases add up to the whole
start-up. Work done in a background thread (the dataset's listing, started beside the model build
with :func:`prefetch`) counts only where the command waits for it.

Phases: ``import`` (process start to ``xmesh.cli.main``), ``cluster`` (a local cluster's start),
``listing`` (the list read, every sample's files checked, the output folder and the resume rule),
``model`` (weights read, the model built), ``kernels`` (its kernels loaded: built or read from
the caches), ``workers`` (until the first of a cluster's workers has its model built and its pools
started; the workers start building as they join, within ``cluster`` for a cluster started here)
and ``other`` (argument parsing, pools, what is left). :func:`begin` starts the command's clock; a
library call gets one that starts when it is made (:func:`adopt`). The same clock gives the seconds after the
last batch (``finish``: the last meshes and rows written, the summary made).
"""

from __future__ import annotations

import os
import threading
import time

PHASES = ("import", "cluster", "listing", "model", "kernels", "workers", "other")
PREFIX = "startup_"  # run.timing's keys: "startup" (the total) and "startup_<phase>"
FINISH = "finish"  # run.timing's seconds from the last batch to the outputs written

_IMPORTED = time.perf_counter()
_lock = threading.Lock()
_clock: StartupClock | None = None
_begun = False
_prefetched: dict = {}


def process_age() -> float | None:
    """Seconds since this process started, to the kernel's clock tick (Linux), else None."""
    try:
        with open("/proc/self/stat", "rb") as handle:
            stat = handle.read()
        fields = stat[stat.rindex(b")") + 2 :].split()  # the name may hold spaces; field 3 comes after it
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start time after boot, in ticks
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def process_start() -> float:
    """The ``time.perf_counter()`` value at which this process started (or this module was imported)."""
    age = process_age()
    return _IMPORTED if age is None else min(_IMPORTED, time.perf_counter() - age)


class StartupClock:
    """Phase seconds from ``origin`` (a ``perf_counter`` value) to the first batch."""

    def __init__(self, origin: float | None = None):
        self.origin = time.perf_counter() if origin is None else float(origin)
        self.last = self.origin
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.total: float | None = None

    def mark(self, phase: str) -> None:
        """Give the time since the previous mark to ``phase``."""
        now = time.perf_counter()
        self.seconds[phase] += max(0.0, now - self.last)
        self.last = max(self.last, now)

    def first_batch(self) -> dict:
        """Close the clock (the rest goes to ``other``); run.timing's start-up entries."""
        if self.total is None:
            self.mark("other")
            self.total = self.last - self.origin
        return {"startup": self.total, **{PREFIX + k: v for k, v in self.seconds.items()}}

    def after_last_batch(self, wall: float) -> dict:
        """run.timing's ``finish``: the seconds from the last batch (the first one's moment plus the
        pipeline's ``wall``) to now; nothing when no batch ran."""
        if self.total is None:
            return {}
        return {FINISH: max(0.0, time.perf_counter() - (self.last + float(wall)))}


def begin() -> StartupClock:
    """Start the command's clock, from the process's start (from now on a later call in the same
    process, e.g. a test calling ``xmesh.cli.main`` again); the time so far is ``import``."""
    global _clock, _begun
    with _lock:
        origin = None if _begun else process_start()
        _begun = True
        _clock = StartupClock(origin)
        _prefetched.clear()
    _clock.mark("import")
    return _clock


def end() -> None:
    """Drop the command's clock and any listing started ahead, once the command returns."""
    global _clock
    with _lock:
        _clock = None
        _prefetched.clear()


def mark(phase: str) -> None:
    """Mark ``phase`` on the command's clock (nothing without one: a library call)."""
    clock = _clock
    if clock is not None:
        clock.mark(phase)


def adopt() -> StartupClock:
    """The command's clock for the run about to start (taken, so a second run in the same command
    gets its own), or a clock starting now."""
    global _clock
    with _lock:
        clock, _clock = _clock, None
    return clock if clock is not None else StartupClock()


def format_startup(timing: dict) -> str:
    """'start-up 1.23 s: model 0.61, import 0.40, ... to the first batch' (phases over 5 ms, largest
    first), then '; 0.12 s from the last batch to the outputs written'; '' without."""
    if "startup" not in timing:
        return ""
    phases = sorted(((k[len(PREFIX) :], v) for k, v in timing.items() if k.startswith(PREFIX)), key=lambda kv: -kv[1])
    text = (
        f"start-up {timing['startup']:.2f} s: "
        + ", ".join(f"{k} {v:.2f}" for k, v in phases if v >= 0.005)
        + " to the first batch"
    )
    if FINISH in timing:
        text += f"; {timing[FINISH]:.2f} s from the last batch to the outputs written"
    return text


class _Prefetch(threading.Thread):
    def __init__(self, fn, args):
        super().__init__(name="xmesh-prefetch", daemon=True)
        self.fn, self.args = fn, args
        self.result = self.error = None

    def run(self) -> None:
        try:
            self.result = self.fn(*self.args)
        except BaseException as exc:  # raised where the result is taken
            self.error = exc


def prefetch(fn, *args) -> None:
    """Start ``fn(*args)`` in a thread now; :func:`take` with the same ``fn`` and ``args`` gets its result."""
    job = _Prefetch(fn, args)
    with _lock:
        _prefetched[(fn, args)] = job
    job.start()


def take(fn, *args):
    """``fn(*args)``: the prefetched result (waiting for it) or computed now."""
    with _lock:
        job = _prefetched.pop((fn, args), None)
    if job is None:
        return fn(*args)
    job.join()
    if job.error is not None:
        raise job.error
    return job.result
