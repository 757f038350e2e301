"""Zhang 2021's initialisation and depth interventions over 3 pre-training seeds at a CPU size: the oracle initialisation
(every parameter tensor of the pre-trained model with its elements permuted, Table 6), random weights rescaled to the
pre-trained statistics (variance or magnitude, §5.1) and the last half of the layers removed (Table 8), applied to the
step-900 checkpoint of the demo's recipe (demo_config: tiny2, sinusoidal positions, 900 steps, 1.8M tokens of
English), pre-training seeds 0, 1, 2 (the runs of english-vs-none-cpu, pre-trained again: the recipe is
deterministic). On this 2-layer model removing the last half and removing every 2nd layer both remove layer 2: one arm.
Each intervened model is fine-tuned on brown-pos with fine-tuning seeds 0, 1, 2 (max_train 2000, max_eval 500, default
hyperparameters): the same call, data and seeds as english-vs-none-cpu, whose original (step 900) and clean (step 0:
no pre-training) rows are the other two arms. One fine-tuning of the original model (pre-training seed 0, fine-tuning
seed 0) is repeated as a check that the re-made runs are those of english-vs-none-cpu."""
import sys, time, json
from pathlib import Path
import pandas as pd
import nl_embryo.analysis
from nl_embryo.demo import demo_config
from nl_embryo.pretrain import pretrain
from nl_embryo.timeline import Run
from nl_embryo.finetune import finetune
from nl_embryo.interventions import apply_interventions
from nl_embryo.models import quiet_transformers
ARMS = {'oracle': 'oracle_init', 'rescaled (variance)': 'rescale_init(match=variance)',
        'rescaled (magnitude)': 'rescale_init(match=magnitude)', 'last half removed': 'remove_layers(last=1)'}
root = Path(sys.argv[1] if len(sys.argv) > 1 else '/tmp/w/ivinit')
t0 = time.time()
rows, check = [], {}
for seed in (0, 1, 2):
    out = root/f'english-seed{seed}'
    run = Run(pretrain(demo_config(str(out), seed=seed), resume=(out/'checkpoints').exists(), quiet=True))
    print(f"seed {seed} pre-trained at {time.time() - t0:.0f} s", flush=True)
    with quiet_transformers(): base, tok = run.load(900)
    if seed == 0:
        r = finetune(base, tok, ['brown-pos'], [0], 2000, 500, 0, progress=False)
        check = r[(r.split == 'test') & r.primary].iloc[0][['metric', 'value']].to_dict()
        print(f"check: original, pre-training seed 0, fine-tuning seed 0: {check}", flush=True)
    for arm, spec in ARMS.items():
        r = finetune(apply_interventions(base, spec), tok, ['brown-pos'], [0, 1, 2], 2000, 500, 0, progress=False)
        rows.append(r.assign(pretrain_seed=seed, intervention=arm, spec=spec, step=900))
        print(f"seed {seed} {arm} fine-tuned at {time.time() - t0:.0f} s", flush=True)
    pd.concat(rows, ignore_index=True).to_parquet(root/'results.parquet', index=False)
df = pd.concat(rows, ignore_index=True)
(root/'check.json').write_text(json.dumps(dict(check, seconds=round(time.time() - t0))))   # kept in run.json's `check`
print(df[(df.split == 'test') & df.primary].groupby(['intervention', 'pretrain_seed'])['value'].agg(['mean', 'std', 'count']))
print(f"done in {time.time() - t0:.0f} s")
