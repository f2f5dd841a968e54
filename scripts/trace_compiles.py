"""Run one ``xmesh`` command and list every NVRTC compilation it makes, with its time.

Usage::

    python scripts/trace_compiles.py [--json FILE] -- reconstruct a.png b.png c.png --cameras cameras.txt ...

Every compilation goes through ``cupy_backends.cuda.libs.nvrtc.compileProgram``: CuPy's own
element-wise and reduction kernels, ``cupy.RawModule`` (xmesh's stage files, ``tc_gemm.cu``) and
xmesh's direct NVRTC builds (the ``sm_90a`` kernels). This script wraps that function, so it sees them
all: the program's name, its options, the source's length, the seconds it took and the thread. At the
end it prints them longest first, the totals per program name, and the command's wall time.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the records to this file")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the xmesh command line (after --)")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command

    from cupy_backends.cuda.libs import nvrtc

    names, records, lock = {}, [], threading.Lock()
    create, compile_program = nvrtc.createProgram, nvrtc.compileProgram

    def traced_create(source, name, headers, include_names):
        program = create(source, name, headers, include_names)
        names[program] = (str(name), len(source))
        return program

    def traced_compile(program, options):
        start = time.perf_counter()
        try:
            return compile_program(program, options)
        finally:
            name, chars = names.get(program, ("?", 0))
            with lock:
                records.append(
                    {
                        "name": name.rsplit("/", 1)[-1],
                        "chars": chars,
                        "options": list(options),
                        "seconds": time.perf_counter() - start,
                        "thread": threading.get_ident(),
                        "start": start,
                    }
                )

    nvrtc.createProgram, nvrtc.compileProgram = traced_create, traced_compile
    from xmesh.cli import main as xmesh_main

    start = time.perf_counter()
    status = xmesh_main(command)
    wall = time.perf_counter() - start
    total = sum(r["seconds"] for r in records)
    print(
        f"\n{len(records)} NVRTC compilations, {total:.2f} s of compiling, {wall:.2f} s wall for the command",
        file=sys.stderr,
    )
    for r in sorted(records, key=lambda r: -r["seconds"])[:40]:
        opts = " ".join(o for o in r["options"] if not o.startswith("-I"))
        print(f"  {r['seconds']:7.2f} s  {r['name']:28s} {r['chars']:7d} chars  {opts}", file=sys.stderr)
    per_name: dict = {}
    for r in records:
        key = r["name"] if not r["name"].endswith((".cu",)) or r["chars"] > 2000 else "(small .cu)"
        count, seconds = per_name.get(key, (0, 0.0))
        per_name[key] = (count + 1, seconds + r["seconds"])
    print("per program name:", file=sys.stderr)
    for key, (count, seconds) in sorted(per_name.items(), key=lambda kv: -kv[1][1]):
        print(f"  {seconds:7.2f} s  {count:3d} x  {key}", file=sys.stderr)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"command": command, "wall": wall, "records": records}, handle, indent=1)
    return status


if __name__ == "__main__":
    sys.exit(main())
