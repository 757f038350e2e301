"""Demo recipes: which size and recipe make the demo's embryo visible, judged by the demo's own checks.

Each variant is the demo's run (`nl_embryo.demo.demo_config`: the `english` corpus, blocks of 64, batch 32, 1,000 steps:
2M tokens, evaluated every 125 steps on 8 batches) with a few options changed. After pre-training, mask prediction
(the reconstruction analysis: one masked word per copy, at least 200 words per group) runs on the last checkpoint.
Printed per variant: the held-out MLM loss's distance below the unigram entropy (every scored token [MASK]ed, as the
loop's eval does since 2026-11-24: see bench/eval_split.py), the POS classes whose masked words are
predicted exactly with the lower end of the 95% interval above 0 (the demo's check 2 needs 4), and each class's
accuracy. One seed per variant unless its name says a seed: the outcome turns on when a run crosses its transition
off the plateau, so two seeds of one recipe can differ by 0.3 nat (tiny2 with random positions: 0.62 and 0.94);
read a difference between variants as real only beyond that.

Runs go to separate processes, `--workers` at a time, each on `--threads` threads (the default, 2 x 1, uses both
cores of the project's machine; a tiny run takes about 8 minutes that way, measured before the bf16 attention change).
The tiny2 rows and the sinusoidal tiny row of the demo chapter ran one at a time on two threads (--workers 1 --threads 2),
as the demo itself runs; a run's outcome depends on its thread count as well as its seed.

    python bench/demo_recipes.py [--variants all|'NAME|NAME'] [--workers 2] [--threads 1] [--steps N] [--out DIR]

(`--steps`: every variant at N steps instead of its own, for a quick look; the table above is at the variants' own.)
"""
import argparse, json, os, subprocess, sys, tempfile, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

VARIANTS = {   # name -> demo_config overrides (tiny2 with its recipe: the demo's default; tiny: --preset tiny; mini: --preset mini)
    'mini (--preset mini)': dict(preset='mini'),
    'mini, batch 16 x 2000 steps': dict(preset='mini', batch_size=16, steps=2000),
    'mini, lr 1e-3': dict(preset='mini', lr=1e-3),
    'mini, lr 1.5e-3': dict(preset='mini', lr=1.5e-3),
    'mini, 50% masking, warm-up 0.25': dict(preset='mini', mask_prob=0.5, warmup=0.25),
    'mini, 50% masking, warm-up 0.25, 1250 steps': dict(preset='mini', mask_prob=0.5, warmup=0.25, steps=1250),
    'tiny (its recipe: 30%, warm-up 0.5)': dict(preset='tiny', position_init='random', mask_prob=0.3, warmup=0.5),
    'tiny, lr 2e-3': dict(preset='tiny', position_init='random', mask_prob=0.3, warmup=0.5, lr=2e-3),
    'tiny, warm-up 0.1': dict(preset='tiny', position_init='random', mask_prob=0.3, warmup=0.1),
    'tiny, 40% masking, warm-up 0.25': dict(preset='tiny', position_init='random', mask_prob=0.4, warmup=0.25),
    'tiny, 40% masking, warm-up 0.1': dict(preset='tiny', position_init='random', mask_prob=0.4, warmup=0.1),
    'tiny, 50% masking, warm-up 0.25 (the demo until 2026-11-25)': dict(preset='tiny', position_init='random'),
    'tiny, 60% masking, warm-up 0.25': dict(preset='tiny', position_init='random', mask_prob=0.6, warmup=0.25),
    "the demo's recipe over 800 steps": dict(preset='tiny', position_init='random', steps=800),
    "the demo's recipe over 700 steps": dict(preset='tiny', position_init='random', steps=700),
    'tiny, 50% masking, all [MASK] (100/0/0)': dict(preset='tiny', position_init='random', mask_split='100/0/0'),
    "2 layers of 256, BERT's recipe, 50% masking, warm-up 0.25": dict(preset=dict(name='wide2', hidden=256, layers=2, heads=4, intermediate=1024),
                                                                      recipe='bert', mask_prob=0.5, warmup=0.25),   # a size of this run only: no recipe of its own
    'tiny2, random positions': dict(preset='tiny2', position_init='random', steps=1000),
    'tiny2, random positions, seed 1': dict(preset='tiny2', position_init='random', steps=1000, seed=1),
    "tiny2, sinusoidal positions (the demo's recipe)": dict(preset='tiny2', steps=1000),
    'tiny2, sinusoidal positions, seed 1': dict(preset='tiny2', steps=1000, seed=1),
    'tiny2, sinusoidal positions, seed 2': dict(preset='tiny2', steps=1000, seed=2),
    'the demo as it runs (tiny2, 900 steps)': dict(preset='tiny2'),
    'the demo as it runs, seed 1': dict(preset='tiny2', seed=1),
    'the demo as it runs, seed 2': dict(preset='tiny2', seed=2),
    'tiny, 50% masking, warm-up 0.25, sinusoidal positions (--preset tiny)': dict(preset='tiny'),
}


def child(spec):
    import torch, warnings
    warnings.filterwarnings('ignore')
    torch.set_num_threads(spec['threads'])
    from nl_embryo.models import PRESETS, SizePreset
    if isinstance(spec['options'].get('preset'), dict):       # a size of its own: registered in this process only
        p = SizePreset(**spec['options']['preset']); PRESETS[p.name] = p; spec['options']['preset'] = p.name
    from nl_embryo.demo import demo_config, run_analyses
    from nl_embryo.checkpoints import list_checkpoints
    from nl_embryo.pretrain import pretrain
    from nl_embryo.timeline import Run
    t0 = time.perf_counter()
    run_dir = pretrain(demo_config(spec['out'], **spec['options']), quiet=True)
    train_s = time.perf_counter() - t0
    last = max(list_checkpoints(run_dir, warn=False))
    run_analyses(run_dir, steps=[last], analyses=['reconstruction'], progress=False)
    run = Run(run_dir)
    ev = run.metrics().dropna(subset=['eval_mlm_loss'])
    t = run.table('reconstruction')
    d = t[(t['task'] == 'prediction') & (t['grouping'] == 'pos') & (t['step'] == last)]
    print(json.dumps(dict(name=spec['name'], below=float(run.config['unigram_entropy'] - ev['eval_mlm_loss'].iloc[-1]),
                          train_s=round(train_s), groups=sorted(d.loc[d['lo'] > 0, 'group']),
                          acc={g: [round(v, 3), round(lo, 3), round(hi, 3)] for g, v, lo, hi in zip(d['group'], d['value'], d['lo'], d['hi'])})))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--variants', default='all', help=f"names separated by | or 'all' (of: {' | '.join(VARIANTS)})".replace('%', '%%'))
    ap.add_argument('--steps', type=int, default=None, help="every variant at this many steps (default: the variant's own)")
    ap.add_argument('--workers', type=int, default=2); ap.add_argument('--threads', type=int, default=1)
    ap.add_argument('--out', default=None, help='folder of the runs (default: a temporary folder)')
    ap.add_argument('--child', help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child: return child(json.loads(a.child))
    names = list(VARIANTS) if a.variants == 'all' else [n.strip() for n in a.variants.split('|')]
    if unknown := [n for n in names if n not in VARIANTS]: sys.exit(f"unknown variant(s) {unknown}: choose from {list(VARIANTS)}")
    out = Path(a.out or tempfile.mkdtemp(prefix='demo-recipes-'))
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))

    def run(i_name):
        i, name = i_name
        options = dict(VARIANTS[name], **({} if a.steps is None else dict(steps=a.steps)))
        spec = dict(name=name, options=options, threads=a.threads, out=str(out/f'v{i:02d}'))
        r = subprocess.run([sys.executable, __file__, '--child', json.dumps(spec)], capture_output=True, text=True, env=env)
        if r.returncode: print(f"failed: {name}\n{r.stderr[-2000:]}", file=sys.stderr); return None
        res = json.loads(r.stdout.strip().splitlines()[-1])
        print(f"{name:50s} {res['below']:+.3f} nat below | {len(res['groups'])} POS classes above 0: {', '.join(res['groups']) or '-'} "
              f"| {res['train_s']} s of pre-training", flush=True)
        return res
    print(f"{len(names)} variant(s), {a.workers} at a time on {a.threads} thread(s) each; runs in {out}")
    with ThreadPoolExecutor(a.workers) as pool: results = [r for r in pool.map(run, enumerate(names)) if r]
    print('\nmask prediction by POS at the last checkpoint (accuracy [95% interval]):')
    for r in results:
        print(f"  {r['name']}: " + '; '.join(f"{g} {v:.3f} [{lo:.3f}, {hi:.3f}]" for g, (v, lo, hi) in r['acc'].items() if v > 0))


if __name__ == '__main__':
    main()
