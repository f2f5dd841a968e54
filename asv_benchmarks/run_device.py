"""`asv run --python=same` for a checkout without git history (the GPU device), results saved under a given commit.

asv records results of an existing environment only with ``--set-commit-hash``, which it resolves
in the git repository; the device's copy of the working tree has an empty ``.git``. This wrapper
gives asv a stand-in repository that answers with the commit you name, then runs asv's own
``run`` command, so the results file is asv's own format::

    python3 run_device.py COMMIT [--date UNIX_SECONDS] [asv run options, e.g. --machine h100 -b time_]

COMMIT: the full hash the tree was checked out at (``git rev-parse HEAD`` where git history exists);
UNIX_SECONDS: its commit time (``git log -1 --format=%ct``; default: now). Run it from this folder.
asv drops ``PYTHONPATH`` from the benchmarks' processes: a checkout that is not installed goes in
``ASV_PYTHONPATH`` instead (``ASV_PYTHONPATH=/path/to/checkout python3 run_device.py ...``).
"""

from __future__ import annotations

import datetime
import sys


def main(argv: list[str]) -> int:
    import asv.commands.run as asv_run
    import asv.main
    from asv.repo import NoRepository

    if not argv or argv[0].startswith("-") or len(argv[0]) != 40:
        print(__doc__, file=sys.stderr)
        return 2
    commit, rest = argv[0], argv[1:]
    when = datetime.datetime.now(datetime.timezone.utc)
    if rest[:1] == ["--date"]:
        when = datetime.datetime.fromtimestamp(int(rest[1]), datetime.timezone.utc)
        rest = rest[2:]
    stamp = int(when.timestamp() * 1000)  # asv stores dates as JavaScript milliseconds

    class PinnedCommit(NoRepository):
        dvcs = "pinned"

        def get_hash_from_name(self, name):
            return commit

        def get_date(self, hash):
            return stamp

        def get_date_from_name(self, name):
            return stamp

    asv_run.get_repo = lambda conf: PinnedCommit()
    sys.argv = ["asv", "run", "--python=same", "--set-commit-hash", commit, *rest]
    return asv.main.main() or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
