"""Analysing a long timeline: one pass, each checkpoint loaded once for every analysis, and memory that stays flat."""
import json, subprocess, sys, textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
N_CKPT = 44

TRAIN = textwrap.dedent('''
    import sys
    from nl_embryo.pretrain import PretrainConfig, pretrain
    n = int(sys.argv[2])
    pretrain(PretrainConfig(out=sys.argv[1], preset='mini', corpus='nested-zipf', corpus_tokens=40_000, block_size=32, batch_size=4,
                            steps=n - 1, checkpoints=','.join(map(str, range(n))), eval_batches=1), quiet=True)
''')

ANALYSE = textwrap.dedent('''
    import json, resource, sys
    import pandas as pd
    from nl_embryo.registry import Analysis, analyze_many
    from nl_embryo.timeline import Run
    import nl_embryo.analysis
    run = Run(sys.argv[1])
    loads = []
    orig = Run.load
    Run.load = lambda self, *a, **k: loads.append(a) or orig(self, *a, **k)
    def rss_checkpoint(model, tokenizer, data, step):   # the process's peak and current resident memory, in KiB, while a checkpoint is loaded
        now = int(open('/proc/self/statm').read().split()[1]) * resource.getpagesize() // 1024
        return pd.DataFrame([dict(metric='peak', value=float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)), dict(metric='now', value=float(now))])
    rss = Analysis('rss', 'memory', rss_checkpoint, lambda run: [None], default=False)
    res = analyze_many(run, ['attention', 'weights', rss], progress=False, charts=False)
    r = res['rss'].sort_values('step')
    print(json.dumps(dict(peak=r[r.metric == 'peak'].value.tolist(), now=r[r.metric == 'now'].value.tolist(), loads=len(loads),
                          steps=len(run.steps()), integrity=len(run.table('integrity')), rows={k: len(v) for k, v in res.items()})))
''')


def test_one_pass_over_44_checkpoints_loads_each_once_and_memory_stays_flat(tmp_path):
    p = subprocess.run([sys.executable, '-c', TRAIN, str(tmp_path/'run'), str(N_CKPT)], capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    p = subprocess.run([sys.executable, '-c', ANALYSE, str(tmp_path/'run')], capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r['steps'] == N_CKPT and r['integrity'] == 0                 # a genuine run: no anomaly, every checkpoint analysed
    assert r['loads'] == N_CKPT                                         # each checkpoint loaded once for the three analyses
    assert r['rows']['attention'] > 0 and r['rows']['weights'] > 0 and len(r['now']) == N_CKPT
    for what in ('peak', 'now'):                                        # KiB; from the 5th checkpoint (warm) to the last
        growth_mb = (r[what][-1] - r[what][4]) / 1024
        assert growth_mb < 16, f"{what} resident memory grew {growth_mb:.1f} MB from checkpoint 5 to {N_CKPT}: {r[what][::8]}"


RERUN = textwrap.dedent('''
    import json, sys
    opened = []
    sys.addaudithook(lambda ev, args: opened.append(str(args[0])) if ev == 'open' and str(args[0]).endswith('.safetensors') else None)
    from nl_embryo.timeline import Run
    import nl_embryo.analysis
    from nl_embryo.registry import analyze_many
    loads = []
    orig = Run.load
    Run.load = lambda self, *a, **k: loads.append(a) or orig(self, *a, **k)
    run = Run(sys.argv[1], out=sys.argv[2])
    before = len(opened)
    res = analyze_many(run, ['weights'], progress=False, charts=False)
    print(json.dumps(dict(listing=before, analysis=len(opened) - before, files=sorted(set(opened))[:3], loads=len(loads), rows=len(res['weights']))))
''')


def test_a_cached_rerun_of_a_foreign_40_checkpoint_timeline_reads_no_weight_file(tmp_path):
    "Step folders nl_embryo did not write: the first analyze hashes and computes; a second process finds every result without opening a weight file."
    import shutil
    p = subprocess.run([sys.executable, '-c', TRAIN, str(tmp_path/'run'), '40'], capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    suite = tmp_path/'suite'
    for ck in (tmp_path/'run'/'checkpoints').iterdir():
        (suite/ck.name).mkdir(parents=True)
        for f in ck.iterdir():
            if f.name not in ('manifest.json', 'optimizer.safetensors', 'trainer_state.json') and f.is_file(): shutil.copy(f, suite/ck.name/f.name)
    runs = [json.loads(subprocess.run([sys.executable, '-c', RERUN, str(suite), str(tmp_path/'out')], capture_output=True, text=True, cwd=ROOT,
                                      timeout=900).stdout.strip().splitlines()[-1]) for _ in range(2)]
    first, again = runs
    assert first['loads'] == 40 and first['rows'] > 0 and first['analysis'] >= 40          # the first pass reads every checkpoint
    assert again['loads'] == 0 and again['rows'] == first['rows']                          # the second: every row from the cache
    assert again['analysis'] == 0 and again['listing'] <= 40, again                      # no weight file opened to find it (listing: a header check each)
