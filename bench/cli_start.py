"""How long the command line takes to answer before it does any work: the CPU seconds (user + system, of the whole
process) of `nl-embryo --help`, every `SUB --help`, two argument errors, `timeline` and `verify` of a small run, and
`import nl_embryo`, beside `python -c pass` and `python -c "import torch"` measured in the same rounds (interleaved, so a
busy machine slows all of them alike). Each command also reports whether torch, transformers or Altair were imported.

    python bench/cli_start.py [--rounds 5] [--out nbs/data/bench/cpu-DATE/cli_start.csv]

Prints one row per command: min / median / max CPU seconds, the ratio of the median to `import torch`'s, and the heavy
modules it imported (none, for every command here). The goal: each under 3 s of CPU on the project's 2-core machine."""
import argparse, csv, json, os, resource, statistics, subprocess, sys, tempfile, time, warnings
from pathlib import Path

PY = sys.executable
PROBE = ("import sys, json\nfrom nl_embryo.cli import main\nargv = json.loads(sys.argv[1])\n"
         "try: main(argv)\nexcept SystemExit: pass\n"
         "sys.stderr.write('\\nHEAVY ' + ','.join(m for m in ('torch', 'transformers', 'altair') if m in sys.modules) + '\\n')")


def cpu_of(cmd, env) -> tuple[float, str]:
    "The CPU seconds (user + system) of one run of `cmd`, and the heavy modules it reported."
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    heavy = next((l[6:] for l in r.stderr.splitlines() if l.startswith('HEAVY ')), '')
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), heavy


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--rounds', type=int, default=5)
    ap.add_argument('--out', default=None, help='a CSV of every measurement (command, round, cpu_s, heavy)')
    args = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore')
    with tempfile.TemporaryDirectory() as d:
        run = Path(d)/'run'
        warnings.simplefilter('ignore')
        from nl_embryo.pretrain import PretrainConfig, pretrain      # a small run for timeline and verify (setup, not measured)
        pretrain(PretrainConfig(out=str(run), preset='mini', corpus='nested-zipf', corpus_tokens=40_000, block_size=32, batch_size=8,
                                steps=2, checkpoints='0,1,2', eval_batches=1), quiet=True)
        cli = lambda *a: [PY, '-c', PROBE, json.dumps([str(x) for x in a])]
        cmds = {'python -c pass': [PY, '-c', 'pass'], 'python -c "import torch"': [PY, '-c', 'import torch'],
                'import nl_embryo': [PY, '-c', "import sys, nl_embryo; sys.stderr.write('\\nHEAVY ' + ','.join(m for m in ('torch', 'transformers', 'altair') if m in sys.modules) + '\\n')"],
                'nl-embryo --help': cli('--help')}
        for sub in ('data', 'corpus', 'pretrain', 'analyze', 'timeline', 'verify', 'sweep', 'demo', 'docs', 'report'):
            cmds[f'nl-embryo {sub} --help'] = cli(sub, '--help')
        cmds['nl-embryo pretrain --stpes 5 (typo)'] = cli('pretrain', '--stpes', '5')
        cmds['nl-embryo analyze RUN --probs (typo)'] = cli('analyze', run, '--probs')
        cmds['nl-embryo timeline RUN'] = cli('timeline', run)
        cmds['nl-embryo verify RUN'] = cli('verify', run)
        rows = []
        for k in range(args.rounds):                       # interleaved: every command once per round
            for name, cmd in cmds.items():
                s, heavy = cpu_of(cmd, env)
                rows.append(dict(command=name, round=k, cpu_s=round(s, 3), heavy=heavy))
    torch_med = statistics.median(r['cpu_s'] for r in rows if r['command'] == 'python -c "import torch"')
    print(f"CPU seconds per whole process, {args.rounds} interleaved rounds (min / median / max), and the median's ratio to `import torch`'s {torch_med:.2f} s")
    for name in cmds:
        v = [r['cpu_s'] for r in rows if r['command'] == name]
        heavy = sorted({h for r in rows if r['command'] == name for h in r['heavy'].split(',') if h})
        said = '(a baseline)' if name.startswith('python -c') else f"imports: {', '.join(heavy) or 'no torch, transformers or altair'}"
        print(f"{name:42s} {min(v):5.2f} / {statistics.median(v):5.2f} / {max(v):5.2f}  x{statistics.median(v) / torch_med:4.2f}  {said}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, 'w', newline='') as f:
            w = csv.DictWriter(f, fieldnames=['command', 'round', 'cpu_s', 'heavy']); w.writeheader(); w.writerows(rows)


if __name__ == '__main__':
    main()
