"""English vs no pre-training over 3 pre-training seeds: the demo's recipe (seed 0 is the demo run), brown-pos fine-tuned
at step 0 (no pre-training) and step 900 (English), 3 fine-tuning seeds, the same data and seeds in both arms."""
import sys, time, json
from pathlib import Path
import pandas as pd
import nl_embryo.analysis
from nl_embryo.demo import demo_config
from nl_embryo.pretrain import pretrain
from nl_embryo.finetune import finetune_run
t0 = time.time()
runs = {0: Path('/tmp/w/demo')}
for seed in (1, 2):
    out = Path(f'/tmp/w/seeds/seed{seed}')
    cfg = demo_config(str(out), seed=seed)
    runs[seed] = Path(pretrain(cfg, resume=(out/'checkpoints').exists(), quiet=True))
    print(f"seed {seed} pre-trained at {time.time() - t0:.0f} s", flush=True)
rows = []
for seed, run in runs.items():
    r = finetune_run(run, tasks=['brown-pos'], steps=[0, 900], seeds=(0, 1, 2), progress=False)
    r['pretrain_seed'] = seed
    rows.append(r)
    print(f"seed {seed} fine-tuned at {time.time() - t0:.0f} s", flush=True)
df = pd.concat(rows, ignore_index=True)
df.to_parquet('/tmp/w/english_vs_none.parquet', index=False)
print(df[(df.split == 'test') & df.primary].groupby(['pretrain_seed', 'step'])['value'].agg(['mean', 'std', 'count']))
print(f"done in {time.time() - t0:.0f} s")
