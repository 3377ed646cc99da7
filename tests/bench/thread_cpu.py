#!/usr/bin/env python3
"""Per-thread CPU of the processes named NAME while a command runs.

    thread_cpu.py [-i SECONDS] [-w SECONDS] [-m REGEX] NAME -- COMMAND [ARGS...]

Runs COMMAND; every -i seconds (0.02) reads /proc/PID/task/TID/stat of
every process whose comm is NAME (l3kvd: the daemons a benchmark starts),
and once COMMAND exits prints, for the -w seconds (0.3) in which those
processes used the most CPU together, each thread's busy share of that
window (utime + stime over wall time) by process and thread name
(l3kvd names its threads: the loop is l3kvd, the others l3kv-*). With
-m the window is the command's own instead: the first line of its output
(passed through) that REGEX matches gives the start and end, in
CLOCK_MONOTONIC seconds, as its two groups (bench_peer -v: -m 'restores
from ([0-9.]+) to ([0-9.]+)').
Where perf is not installed (the GPU host) this says which thread bounds
a benchmark. Only Linux's /proc; no dependency beyond python3.
"""
import argparse
import os
import re
import threading
import subprocess
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")


def sample(name):
    """{(pid, tid): (thread name, cpu ticks)} of the processes named name."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() != name:
                    continue
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    st = f.read()
            except OSError:
                continue
            # comm is in parentheses and may hold spaces: split after the last ')'.
            comm = st[st.index("(") + 1:st.rindex(")")]
            rest = st[st.rindex(")") + 2:].split()
            out[(int(pid), int(tid))] = (comm, int(rest[11]) + int(rest[12]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-i", type=float, default=0.02, help="sampling interval, s")
    ap.add_argument("-w", type=float, default=0.3, help="window reported, s")
    ap.add_argument("-m", help="regex: the window's start and end in the command's output")
    ap.add_argument("name")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("no command")
    window = []
    if a.m:
        pat = re.compile(a.m)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)

        def relay():
            for line in proc.stdout:
                sys.stdout.write(line)
                m = pat.search(line)
                if m and not window:
                    window.extend((float(m.group(1)), float(m.group(2))))
        th = threading.Thread(target=relay, daemon=True)
        th.start()
    else:
        proc = subprocess.Popen(cmd)
    samples = []
    while proc.poll() is None:
        samples.append((time.monotonic(), sample(a.name)))
        time.sleep(a.i)
    if a.m:
        th.join()
    sys.stdout.flush()
    if len(samples) < 2:
        print("thread_cpu: the command ended before two samples", file=sys.stderr)
        return proc.returncode
    ticks = lambda i, j: sum(v[1] - samples[i][1][k][1] for k, v in samples[j][1].items()
                             if k in samples[i][1])
    if a.m:
        if not window:
            print("thread_cpu: no line matched -m", file=sys.stderr)
            return 1
        # The samples that enclose the window.
        bi = max([i for i, s in enumerate(samples) if s[0] <= window[0]] or [0])
        bj = min([j for j, s in enumerate(samples) if s[0] >= window[1]] or [len(samples) - 1])
        if bj <= bi:
            bj = min(bi + 1, len(samples) - 1)
        best = ticks(bi, bj)
        what = f"the command's window ({window[1] - window[0]:.3f} s), sampled over"
    else:
        # The busiest window: the most ticks over all threads seen at both ends.
        best, bi, bj = -1, 0, 1
        j = 0
        for i in range(len(samples)):
            while j < len(samples) - 1 and samples[j][0] - samples[i][0] < a.w:
                j += 1
            tot = ticks(i, j)
            if tot > best:
                best, bi, bj = tot, i, j
        what = "the busiest"
    t0, s0 = samples[bi]
    t1, s1 = samples[bj]
    wall = t1 - t0
    print(f"thread_cpu: {a.name}, {what} {wall:.2f} s (at {t0:.2f} s, CLOCK_MONOTONIC), "
          f"{best / HZ / wall:.2f} cores in all; busy share per thread:")
    rows = {}
    for k, v in s1.items():
        if k in s0:
            key = (k[0], v[0])
            busy, n = rows.get(key, (0, 0))
            rows[key] = (busy + (v[1] - s0[k][1]) / HZ / wall, n + 1)
    for (pid, comm), (busy, n) in sorted(rows.items()):
        each = f" ({n} threads, {busy / n * 100:.0f} % each)" if n > 1 else ""
        print(f"  pid {pid:>7} {comm:<14} {busy * 100:6.0f} %{each}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
