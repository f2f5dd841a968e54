"""A small progress bar on stderr, no dependency.

::

    with Progress(total=120, desc="eval") as bar:
        for batch in batches:
            ...
            bar.update(len(batch))

On a terminal it redraws one line with ``\\r`` at most ``1 / min_interval`` times a second::

    eval  37/120  31% |#########.................| 1.92 samples/s ETA 0:43 elapsed 0:19

Elsewhere (a log file, CI) it writes whole lines instead: one each time another ``line_percent``
percent is done or ``line_seconds`` have passed since the last line, and a last one at the end.
"""
from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

BAR_WIDTH = 24


def format_duration(seconds: float) -> str:
    """``h:mm:ss`` or ``m:ss``; '?' for an unknown duration."""
    if seconds is None or seconds != seconds or seconds in (float("inf"), float("-inf")) or seconds < 0:
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    """Count ``total`` items on ``stream`` (default stderr); see the module docstring.

    ``enabled=False`` draws nothing. ``clock`` (default :func:`time.monotonic`) is replaceable for tests.
    """

    def __init__(self, total: int, desc: str = "", stream: TextIO | None = None, enabled: bool = True,
                 unit: str = "samples", min_interval: float = 0.1, line_percent: float = 10.0,
                 line_seconds: float = 5.0, clock: Callable[[], float] = time.monotonic):
        if int(total) != total or total < 0:
            raise ValueError(f"Progress: total={total!r}; expected a non-negative integer")
        self.total = int(total)
        self.desc = desc
        self.stream = sys.stderr if stream is None else stream
        self.enabled = bool(enabled)
        self.unit = unit
        self.min_interval = float(min_interval)
        self.line_percent = float(line_percent)
        self.line_seconds = float(line_seconds)
        self.clock = clock
        self.count = 0
        self.start = clock()
        self._last_draw = None  # time of the last draw (terminal) or line
        self._last_line_percent = 0.0
        self._last_line_count = -1
        self._width = 0
        self._closed = False
        try:
            self.tty = bool(self.stream.isatty())
        except (AttributeError, ValueError):
            self.tty = False

    # ---------------------------------------------------------------- public
    def __enter__(self) -> "Progress":
        if self.enabled and self.tty:
            self._draw(self.clock())
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.count += int(n)
        if not self.enabled or self._closed:
            return
        now = self.clock()
        if self.tty:
            if self._last_draw is None or now - self._last_draw >= self.min_interval:
                self._draw(now)
        else:
            percent = self._percent()
            if (percent - self._last_line_percent >= self.line_percent
                    or now - (self.start if self._last_draw is None else self._last_draw) >= self.line_seconds):
                self._line(now)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self.enabled:
            return
        now = self.clock()
        if self.tty:
            self._draw(now)
            self._write("\n")
        elif self._last_line_count != self.count:
            self._line(now)

    # ---------------------------------------------------------------- text
    def _percent(self) -> float:
        return 100.0 * self.count / self.total if self.total else 100.0

    def text(self, now: float | None = None) -> str:
        """The status text: count/total, percent, rate, ETA, elapsed."""
        now = self.clock() if now is None else now
        elapsed = max(now - self.start, 0.0)
        rate = self.count / elapsed if elapsed > 0 and self.count else 0.0
        eta = (self.total - self.count) / rate if rate > 0 else (0.0 if self.count >= self.total else None)
        head = f"{self.desc} " if self.desc else ""
        return (f"{head}{self.count}/{self.total} {self._percent():3.0f}% {rate:.2f} {self.unit}/s "
                f"ETA {format_duration(eta)} elapsed {format_duration(elapsed)}")

    def _bar(self) -> str:
        filled = int(BAR_WIDTH * min(self.count, self.total) / self.total) if self.total else BAR_WIDTH
        return "|" + "#" * filled + "." * (BAR_WIDTH - filled) + "|"

    def _draw(self, now: float) -> None:
        head, _, tail = self.text(now).partition("% ")
        line = f"{head}% {self._bar()} {tail}"
        pad = " " * max(self._width - len(line), 0)
        self._width = len(line)
        self._write("\r" + line + pad)
        self._last_draw = now

    def _line(self, now: float) -> None:
        self._write(self.text(now) + "\n")
        self._last_draw = now
        self._last_line_count = self.count
        step = self.line_percent if self.line_percent > 0 else 100.0
        self._last_line_percent = self._percent() // step * step

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken stderr must not stop the work
            self.enabled = False
