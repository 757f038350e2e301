"""A masked and a causal embryo of the same size on the same tokens, over 3 pre-training seeds: the demo's tiny2 BERT
(its recipe) and the causal demo's tiny2 GPT-NeoX, both 500 steps of 32 blocks of 64 English tokens (the same blocks in
the same order for a seed), analysed at the same 8 checkpoints: the POS probe, prediction by POS (masked / next-word)
and the heads' previous-token share (their attention on Brown text). Seed 0 of the causal arm is the causal demo run."""
import sys, time, warnings
from pathlib import Path
import pandas as pd
import nl_embryo.analysis
from nl_embryo.demo import demo_config
from nl_embryo.pretrain import pretrain
from nl_embryo.registry import analyze_runs, pool_seeds, run_labels, seed_groups

warnings.simplefilter('ignore')
root, t0 = Path(sys.argv[1]), time.time()
STEPS = [0, 32, 64, 100, 200, 300, 400, 500]
CAUSAL_SEED0 = Path(sys.argv[2]) if len(sys.argv) > 2 else None      # the causal demo's run folder (seed 0), reused
arms = {'masked': dict(arch='bert', steps=500, eval_every=100, checkpoints='log:64:100'), 'causal': dict(arch='gpt-neox')}
runs = {}
for arm, over in arms.items():
    for seed in (0, 1, 2):
        out = root/arm/f'seed{seed}'
        if arm == 'causal' and seed == 0 and CAUSAL_SEED0: runs[(arm, seed)] = CAUSAL_SEED0; continue
        runs[(arm, seed)] = Path(pretrain(demo_config(str(out), seed=seed, **over), resume=(out/'checkpoints').exists(), quiet=True))
        print(f"{arm} seed {seed} pre-trained at {time.time() - t0:.0f} s", flush=True)
tables = []
KEYS = {'probes': ('step', 'task', 'layer', 'metric'), 'reconstruction': ('step', 'task', 'grouping', 'group', 'metric'),
        'attention': ('step', 'layer', 'head', 'pattern')}     # what identifies a row within a run: the seeds are pooled per key
for name in KEYS:
    for arm in arms:
        labelled = run_labels({f'{arm}/seed{s}': runs[(arm, s)] for s in (0, 1, 2)})
        df = analyze_runs(labelled, name, steps=STEPS, progress=False)
        df = df[df['n_seeds'] == 1]
        pooled = pool_seeds(df, seed_groups(labelled), key=KEYS[name])
        assert len(pooled) and (pooled['n_seeds'] == 3).all(), (name, arm)
        tables.append(pd.concat([df, pooled], ignore_index=True).assign(analysis=name, family=arm))
        print(f"{name} {arm} at {time.time() - t0:.0f} s", flush=True)
keep = ['family', 'analysis', 'run', 'n_seeds', 'step', 'task', 'grouping', 'group', 'metric', 'layer', 'head', 'pattern', 'value', 'lo', 'hi', 'n']
df = pd.concat(tables, ignore_index=True)
df = df[[c for c in keep if c in df.columns]]
df = df[(df.analysis != 'attention') | df['pattern'].isin(['prev', 'entropy_norm'])]
df = df[(df.analysis != 'reconstruction') | ((df.task == 'prediction') & (df.metric == 'accuracy') & (df.grouping == 'pos'))]
df = df[(df.analysis != 'probes') | (df.metric == 'accuracy')]
df.to_parquet(root/'results.parquet', index=False)
print(f"done in {time.time() - t0:.0f} s: {len(df)} rows")
