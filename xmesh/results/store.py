"""An evaluation's output folder as one store: samples.csv resumed, then the summary and the logs.

Opening the store repairs samples.csv (an interrupted write's last line) and reads the ids already
in it; :meth:`ResultsStore.append` takes finished rows (a batch's, or a cluster shard's) and writes
those of new samples in one write and fsync; :meth:`ResultsStore.finish` summarises the *whole*
CSV, so a resumed run's summary covers every sample, and writes summary.json, summary.txt,
f_score.log and cd.log.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError
from .p2m_logs import write_logs
from .samples_csv import CSV_NAME, CsvAppender, read_csv, repair_csv, row_id
from .summary import summary_from_rows, write_summary


class ResultsStore:
    """samples.csv and the files summarising it in ``out_dir`` (an existing folder)."""

    def __init__(self, out_dir: Path):
        self.out_dir = Path(out_dir)
        self.csv_path = self.out_dir / CSV_NAME
        self.repaired_last_line = repair_csv(self.csv_path)
        self.done_ids = {row["id"] for row in read_csv(self.csv_path)} if self.csv_path.exists() else set()
        self.appender: CsvAppender | None = None

    def open(self) -> ResultsStore:
        """Start appending (writing the header to a new file)."""
        self.appender = CsvAppender(self.csv_path)
        return self

    def append(self, text: str) -> None:
        """Append CSV lines, less those of samples already in the file when the store was opened."""
        lines = [line for line in text.splitlines(keepends=True) if row_id(line) not in self.done_ids]
        if lines:
            self.appender.write("".join(lines))

    def close(self) -> None:
        if self.appender is not None:
            self.appender.close()
            self.appender = None

    def __enter__(self) -> ResultsStore:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    def finish(self, run_info: dict, meta: dict | None = None, clock=None) -> dict:
        """The summary of every row in samples.csv with ``run`` (and ``meta``), written with the logs.
        ``clock``: the run's :class:`~xmesh.pipeline.startup.StartupClock`; ``run.timing`` then gains
        ``finish``, the seconds from the last batch to the summary written."""
        rows = read_csv(self.csv_path) if self.csv_path.exists() else []
        if not rows:
            raise InputError(f"{self.csv_path}: no evaluated samples to summarise")
        summary = summary_from_rows(rows)
        summary["run"] = run_info
        if meta:
            summary["meta"] = dict(meta)
        write_logs(self.out_dir, rows)
        if clock is not None and "timing" in run_info:
            run_info["timing"].update(clock.after_last_batch(run_info["seconds"]))
        write_summary(self.out_dir, summary)
        return summary
