"""What an evaluation leaves in its output folder, written and read back.

``samples_csv``: samples.csv (append, repair, read); ``summary``: summary.json / summary.txt;
``p2m_logs``: the original scripts' ``f_score.log`` and ``cd.log``; ``store``: the folder as one
:class:`ResultsStore` (resume, append, summarise).
"""

from .samples_csv import CSV_COLUMNS, CSV_NAME, format_rows, read_csv, repair_csv
from .store import ResultsStore
from .summary import SUMMARY_JSON, SUMMARY_TXT, TAU, TWO_TAU, format_table, summary_from_rows, write_summary

__all__ = [
    "CSV_COLUMNS",
    "CSV_NAME",
    "SUMMARY_JSON",
    "SUMMARY_TXT",
    "TAU",
    "TWO_TAU",
    "ResultsStore",
    "format_rows",
    "format_table",
    "read_csv",
    "repair_csv",
    "summary_from_rows",
    "write_summary",
]
