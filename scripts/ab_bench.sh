#!/usr/bin/env bash
# Old against new in one device call, alternated (old, new, old, new) so that drift between runs
# shows up as the spread of each side:
#   bash scripts/ab_bench.sh OLD_COMMIT [xmesh bench arguments...]
# OLD_COMMIT is checked out with `git archive` into /tmp/xmesh-old; "new" is the working tree. The
# device tool's copy of .git can lag the working tree (it held the session's first commit), so the
# script prints the commit it archived: name an old commit by the hash that copy has.
# Prints the `total` (or first) stage's figures of each run; full tables go to $OUT/ab_*.txt.
set -u
old=$1; shift
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/xmesh-old
git archive "$old" | tar -x -C /tmp/xmesh-old || exit 1
echo "old: $(git log --oneline -1 "$old" | cut -c1-60); new: the working tree"
base=${PYTHONPATH:-}
for round in 1 2; do
  for side in old new; do
    dir=$PWD; [ "$side" = old ] && dir=/tmp/xmesh-old
    (cd "$dir" && PYTHONPATH="$dir${base:+:$base}" timeout 280 python3 -m xmesh bench "$@") \
      > "$OUT/ab_${side}_${round}.txt" 2>&1
    echo "== $side ($([ "$side" = old ] && echo "$old" || echo working tree)), round $round"
    grep -E "^\s*(stage|total|graph_block|drb|cnn|local|samples)" "$OUT/ab_${side}_${round}.txt" | head -20
  done
done
