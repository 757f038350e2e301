"""The causal arm of masked vs causal scored both ways: next-word prediction of a word's first piece (what the
`reconstruction` analysis scores) and of the whole word (every piece the top prediction from the pieces before it, as
mask prediction asks of every piece), at the same 8 checkpoints of the same 3 seeds' recipe, pooled over seeds.
Seeds 1 and 2 are pre-trained again (the stored experiment kept its tables only); seed 0 is the causal demo's run.

    python whole_word.py RUNS_ROOT CAUSAL_DEMO_RUN      # writes RUNS_ROOT/whole_word.parquet
"""
import sys, time, warnings
from pathlib import Path
import pandas as pd
import torch
import nl_embryo.analysis
from nl_embryo.demo import demo_config
from nl_embryo.pretrain import pretrain
from nl_embryo.reconstruction import accuracy_by_group, next_word_correctness, reconstruction_inputs
from nl_embryo.registry import pool_seeds
from nl_embryo.timeline import Run

warnings.simplefilter('ignore')
torch.set_num_threads(2)
root, t0 = Path(sys.argv[1]), time.time()
STEPS = [0, 32, 64, 100, 200, 300, 400, 500]
runs = {0: Path(sys.argv[2])}
for seed in (1, 2):
    out = root/'causal'/f'seed{seed}'
    runs[seed] = Path(pretrain(demo_config(str(out), seed=seed, arch='gpt-neox'), resume=(out/'checkpoints').exists(), quiet=True))
    print(f"causal seed {seed} pre-trained at {time.time() - t0:.0f} s", flush=True)
rows = []
for seed, path in runs.items():
    run = Run(path)
    data, = reconstruction_inputs(run)
    for step in STEPS:
        model, tok = run.load(step)
        for scoring, whole in (('first piece', False), ('whole word', True)):
            acc = accuracy_by_group(next_word_correctness(model, tok, data, whole_word=whole), min_words=data.get('per_group', 1))
            rows.append(acc.assign(run=f'causal/seed{seed}', step=step, scoring=scoring))
    print(f"seed {seed} scored at {time.time() - t0:.0f} s", flush=True)
df = pd.concat(rows, ignore_index=True)
df = df[(df.task == 'prediction') & (df.metric == 'accuracy') & (df.grouping == 'pos')]
pooled = pool_seeds(df, {'causal': [f'causal/seed{s}' for s in runs]}, key=('scoring', 'step', 'group'))
out = pd.concat([df.assign(n_seeds=1), pooled], ignore_index=True)[['run', 'n_seeds', 'scoring', 'step', 'group', 'value', 'lo', 'hi', 'n']]
out.to_parquet(root/'whole_word.parquet', index=False)
print(f"done in {time.time() - t0:.0f} s: {len(out)} rows")
