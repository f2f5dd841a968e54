#!/usr/bin/env bash
# Old against new in one device call, alternated (old, new, old, new) so that drift between runs
# shows up as the spread of each side:
#   bash scripts/ab_bench.sh OLD [xmesh bench arguments...]
# OLD is a commit, checked out with `git archive` into /tmp/xmesh-old, or a folder holding an old
# tree (e.g. one made here with `git archive C | tar -x -C .devout/old` and carried along); "new"
# is the working tree. A copy of .git made earlier can lag the working tree (it may hold an older
# commit), so the script prints the commit it archived: name an old commit by the
# hash that copy has, or carry the old tree as a folder.
# Prints the `total` (or first) stage's figures of each run; full tables go to $OUT/ab_*.txt.
set -u
old=$1; shift
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if [ -d "$old" ]; then
  olddir=$(cd "$old" && pwd)
  echo "old: the tree in $old; new: the working tree"
else
  olddir=/tmp/xmesh-old; mkdir -p "$olddir"
  git archive "$old" | tar -x -C "$olddir" || exit 1
  echo "old: $(git log --oneline -1 "$old" | cut -c1-60); new: the working tree"
fi
base=${PYTHONPATH:-}
for round in 1 2; do
  for side in old new; do
    dir=$PWD; [ "$side" = old ] && dir=$olddir
    (cd "$dir" && PYTHONPATH="$dir${base:+:$base}" timeout 280 python3 -m xmesh bench "$@") \
      > "$OUT/ab_${side}_${round}.txt" 2>&1
    echo "== $side ($([ "$side" = old ] && echo "$old" || echo working tree)), round $round"
    grep -E "^\s*(stage|total|graph|drb|cnn|local|samples)" "$OUT/ab_${side}_${round}.txt" | head -20
  done
done
