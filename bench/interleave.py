"""Interleaved timing that holds on a shared machine: the benchmarks' common harness.

Each compared loop runs in its own long-lived worker process (so one loop's threads, caches and global settings cannot
slow another), set up and warmed up once. The parent then hands the CPU to one worker at a time for a short *segment*
(a few steps or calls, about `segment_s` seconds), in the order A B B A A B ..., for `rounds` rounds. Around every
segment it reads the machine's CPU counters (`/proc/stat`) and the worker's own CPU time, so the CPU that *other*
processes took during the segment is known:

- a segment is **clean** when the others left the worker the cores its threads need (their use is at most the cores
  the worker does not use, plus `tolerance` of a core); only clean segments count;
- each loop's figures are the minimum, the 25th percentile (the headline: a low quantile, which a neighbour can only
  raise), the median and the maximum of its per-step times in clean segments, and its CPU use (CPU seconds per wall
  second per thread: near 1 when the loop has its threads' cores to itself);
- a **ratio** between two loops is their 25th percentiles' ratio, printed only when at least `min_rounds` rounds have
  both segments clean and the per-round ratios (of the two segments' 25th percentiles) agree within `max_disagreement` (max / min); otherwise the harness
  refuses and says why (how much CPU the others took, in how many segments).

`threads='auto'` measures the others' CPU use for a second first and gives the workers the cores left (at least 1): a
neighbour that keeps one of two cores busy then leads to a one-thread measurement, stated as such, rather than to
numbers that measure the neighbour. Linux only (`/proc`).

Worker side: a bench script calls `serve(unit)` (repeated work: each step is one call of `unit()`), or makes a
`Channel()` and calls `channel.step(seconds)` after each step of a loop it does not control (a training loop's
callback). Parent side: `interleave({name: argv, ...})` returns a `Timing`; `ratio(timing, a, b)` the checked ratio.
"""
from __future__ import annotations

import json, math, os, statistics, subprocess, sys, tempfile, time
from dataclasses import dataclass, field

FD_ENV, THREADS_ENV = 'NL_BENCH_FD', 'NL_BENCH_THREADS'
TICK = os.sysconf('SC_CLK_TCK')


# ---------------------------------------------------------------- worker side
def worker_threads() -> int:
    "The thread count the parent chose for this worker (also set as torch's intra-op threads by `Channel`)."
    return int(os.environ.get(THREADS_ENV, '0')) or (os.cpu_count() or 1)


class Channel:
    """A worker's line to the parent. `step(seconds)` records one step's time; after the warm-up steps and after each
    segment it reports and waits for the next order (`go N`: run N more steps; `stop`: exit the process)."""
    def __init__(self, warmup: int = 3):
        if FD_ENV not in os.environ: raise SystemExit("this is a benchmark worker: run it through its bench script")
        self.out = os.fdopen(int(os.environ[FD_ENV]), 'w', buffering=1)
        self.warmup, self.times, self.left = warmup, [], warmup
        try:
            import torch
            torch.set_num_threads(worker_threads())
        except ImportError: pass

    def report(self, **extra):
        self.out.write(json.dumps(dict(times=self.times, **extra)) + '\n')
        self.times = []
        order = sys.stdin.readline().split()
        if not order or order[0] == 'stop':
            sys.stdout.flush(); sys.stderr.flush(); os._exit(0)     # mid-loop: no clean-up of the loop's own to wait for
        self.left = int(order[1])

    def step(self, seconds: float, **extra):
        "Record one step of `seconds`; report and wait for the parent's next order when the segment is done."
        self.times.append(seconds)
        self.left -= 1
        if self.left <= 0: self.report(**extra)


def serve(unit, warmup: int = 1, **extra):
    "Run `unit()` (one step of repeated work) whenever the parent says so, timing each call; never returns."
    ch = Channel(warmup=warmup)
    while True:
        t0 = time.perf_counter(); unit(); ch.step(time.perf_counter() - t0, **extra)


# ---------------------------------------------------------------- parent side
def machine_busy() -> float:
    "CPU seconds all processes have used on this machine (every core), from /proc/stat."
    with open('/proc/stat') as f: v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / TICK           # user nice system [idle iowait] irq softirq steal


def process_cpu(pid: int) -> float:
    "CPU seconds the process `pid` has used (all its threads)."
    with open(f'/proc/{pid}/stat') as f: v = f.read().rsplit(')', 1)[1].split()
    return (int(v[11]) + int(v[12])) / TICK


def others_cores(seconds: float = 1.0) -> float:
    "How many cores other processes kept busy over the next `seconds` (this process sleeps meanwhile)."
    b0, t0 = machine_busy(), time.perf_counter(); time.sleep(seconds)
    return max(0.0, (machine_busy() - b0) / (time.perf_counter() - t0))


def choose_threads(threads='auto', max_threads: int | None = None) -> tuple[int, str]:
    "The workers' thread count and a line saying why: `auto` gives them the cores other processes leave free."
    n = os.cpu_count() or 1
    top = min(n, max_threads or n)
    if threads != 'auto': return int(threads), f"{int(threads)} thread(s), as asked"
    busy = others_cores()
    t = max(1, min(top, n - math.floor(busy + 0.75)))
    why = f"other processes kept {busy:.1f} of {n} cores busy before the run"
    return t, f"{t} thread(s) ({why}{': measuring on the cores left' if t < top else ''})"


def low(times) -> float:
    "The 25th percentile of `times` (inclusive method: within their range; the value itself when there is one)."
    return statistics.quantiles(times, n=4, method='inclusive')[0] if len(times) > 1 else times[0]


@dataclass
class Segment:
    loop: str
    round: int
    times: list
    wall: float
    cpu: float           # the worker's CPU seconds in the segment
    others: float        # cores the other processes used, on average, during the segment
    clean: bool
    extra: dict = field(default_factory=dict)


@dataclass
class Timing:
    threads: int
    why_threads: str
    segments: list
    tolerance: float
    cores: int

    def clean(self, loop: str) -> list:
        return [s for s in self.segments if s.loop == loop and s.clean]

    def stats(self, loop: str) -> dict | None:
        "min, q25, median, max of the per-step seconds in clean segments, CPU use per thread, and the clean share."
        segs = [s for s in self.segments if s.loop == loop]
        t = sorted(x for s in self.clean(loop) for x in s.times)
        if not t: return None
        q25 = low(t)
        use = sum(s.cpu for s in self.clean(loop)) / max(1e-9, sum(s.wall for s in self.clean(loop))) / self.threads
        return dict(min=t[0], q25=q25, median=statistics.median(t), max=t[-1], n=len(t), cpu_use=use,
                    clean=len(self.clean(loop)), segments=len(segs),
                    others=max((s.others for s in segs), default=0.0))

    def interference(self) -> str:
        "A line naming the interference seen (or none)."
        bad = [s for s in self.segments if not s.clean]
        if not bad: return f"no interference: in every segment other processes left the {self.threads} core(s) the loops use"
        worst = max(s.others for s in bad)
        return (f"interference: in {len(bad)} of {len(self.segments)} segments other processes took cores the loops needed "
                f"(up to {worst:.1f} of {self.cores} cores busy beside the measured loop)")


def interleave(loops: dict,                 # {name: argv of the worker process}
               rounds: int = 8,            # rounds; each runs one segment of every loop (order reversed every other round)
               segment_s: float = 1.5,     # aimed length of a segment, in seconds
               min_steps: int = 3,         # at least this many steps per segment
               threads='auto',             # the workers' threads: a number, or 'auto' (the cores other processes leave free)
               max_threads: int | None = None,   # with 'auto': at most this many
               tolerance: float = 0.25,    # a segment is clean when the others used at most the free cores + this much of a core
               quiet: bool = False,
               cwd=None, env: dict | None = None,
              ) -> Timing:
    "Run the loops' workers in interleaved segments; the per-segment times, CPU use and interference as a `Timing`."
    nthreads, why = choose_threads(threads, max_threads)
    if not quiet: print(f"workers on {why}", flush=True)
    cores = os.cpu_count() or 1
    free = max(0, cores - nthreads)
    procs, logs = {}, {}
    try:
        for name, argv in loops.items():             # one at a time: a worker's set-up does not overlap another's
            r, w = os.pipe()
            logs[name] = tempfile.TemporaryFile(mode='w+')
            e = {**os.environ, **(env or {}), FD_ENV: str(w), THREADS_ENV: str(nthreads), 'OMP_NUM_THREADS': str(nthreads)}
            p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=logs[name], stderr=subprocess.STDOUT, pass_fds=(w,),
                                 text=True, cwd=cwd, env=e)
            os.close(w)
            procs[name] = (p, os.fdopen(r))
            first = _message(name, procs[name], logs[name])     # its warm-up is done
            procs[name] += (max(min_steps, math.ceil(segment_s / max(1e-6, statistics.median(first['times'])))),)
        segments, names = [], list(loops)
        for i in range(rounds):
            for name in (names if i % 2 == 0 else names[::-1]):
                p, inbox, steps = procs[name]
                b0, c0, t0 = machine_busy(), process_cpu(p.pid), time.perf_counter()
                p.stdin.write(f'go {steps}\n'); p.stdin.flush()
                msg = _message(name, procs[name], logs[name])
                wall, cpu = time.perf_counter() - t0, process_cpu(p.pid) - c0
                others = max(0.0, (machine_busy() - b0 - cpu) / wall)
                extra = {k: v for k, v in msg.items() if k != 'times'}
                segments.append(Segment(name, i, msg['times'], wall, cpu, others, others <= free + tolerance, extra))
            if not quiet: print('.', end='', flush=True)
        if not quiet: print(flush=True)
        return Timing(nthreads, why, segments, tolerance, cores)
    finally:
        for name, (p, *_ ) in procs.items():
            try: p.stdin.write('stop\n'); p.stdin.flush()
            except (BrokenPipeError, ValueError): pass
        for name, (p, *_ ) in procs.items():
            try: p.wait(timeout=60)
            except subprocess.TimeoutExpired: p.kill()


def _message(name, proc, log) -> dict:
    p, inbox = proc[0], proc[1]
    line = inbox.readline()
    if not line:
        p.wait(); log.seek(0)
        raise SystemExit(f"the {name} worker stopped (exit code {p.returncode}):\n{log.read()[-3000:]}")
    return json.loads(line)


def ratio(timing: Timing, num: str, den: str,
          max_disagreement: float = 1.5,    # the per-round ratios may differ by at most this factor (max / min)
          min_rounds: int = 3,              # rounds with both segments clean needed for a ratio
         ) -> tuple[float | None, str]:
    """`num`'s step time over `den`'s (25th percentiles over clean segments) and a line with the per-round spread; the
    ratio is None, and the line says why, when too few rounds were clean or their ratios disagree."""
    by = {}
    for s in timing.segments: by.setdefault(s.round, {})[s.loop] = s
    rounds = [low(r[num].times) / low(r[den].times)
              for r in by.values() if num in r and den in r and r[num].clean and r[den].clean]
    if len(rounds) < min_rounds:
        return None, (f"refused: only {len(rounds)} of {len(by)} rounds had both loops' segments clean (at least {min_rounds} "
                      f"needed); {timing.interference()}")
    spread = max(rounds) / min(rounds)
    line = f"rounds {min(rounds):.2f}-{max(rounds):.2f}x over {len(rounds)} clean rounds"
    if spread > max_disagreement:
        return None, (f"refused: the per-round ratios disagree by {spread:.2f}x (more than {max_disagreement}x): {line}; "
                      f"{timing.interference()}")
    a, b = timing.stats(num), timing.stats(den)
    return a['q25'] / b['q25'], line


def describe(timing: Timing, loop: str, unit: str = 's/step') -> str:
    "One line: a loop's step-time quantiles over clean segments, its CPU use and how many segments were clean."
    s = timing.stats(loop)
    if s is None: return f"{loop}: no clean segment ({timing.interference()})"
    return (f"{loop}: min {s['min']:.4g} | q25 {s['q25']:.4g} | median {s['median']:.4g} | max {s['max']:.4g} {unit} "
            f"({s['n']} steps in {s['clean']}/{s['segments']} clean segments; CPU use {s['cpu_use']:.0%} of {timing.threads} thread(s))")
