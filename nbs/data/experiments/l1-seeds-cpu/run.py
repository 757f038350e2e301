"""English > nested-Zipf > random > no pre-training over 3 pre-training seeds (Chiang and Lee 2020's main ordering at a CPU size).

The nested-Zipf and random arms are pre-trained with the demo's recipe (demo_config: tiny2, sinusoidal positions,
900 steps, 1.8M tokens), pre-training seeds 0, 1, 2, on their own corpus instead of English; both live in the English
tokenizer's id space, so each seed's network starts from the same initialisation as the English run of that seed
(only the unigram output bias differs, and fine-tuning does not use it). Each step-900 checkpoint is fine-tuned on
brown-pos with fine-tuning seeds 0, 1, 2 (max_train 2000, max_eval 500, default hyperparameters): the same call, data
and seeds as english-vs-none-cpu, whose English (step 900) and no-pre-training (step 0) rows are the other two arms."""
import sys, time, json
from pathlib import Path
import pandas as pd
import nl_embryo.analysis
from nl_embryo.demo import demo_config
from nl_embryo.pretrain import pretrain
from nl_embryo.timeline import Run
from nl_embryo.finetune import finetune_run
root = Path(sys.argv[1] if len(sys.argv) > 1 else '/tmp/w/l1seeds')
t0 = time.time()
rows, losses = [], []
for l1 in ('nested-zipf', 'random'):
    for seed in (0, 1, 2):
        out = root/f'{l1}-seed{seed}'
        cfg = demo_config(str(out), seed=seed, corpus=l1)
        run = Path(pretrain(cfg, resume=(out/'checkpoints').exists(), quiet=True))
        ev = [json.loads(l) for l in (run/'metrics.jsonl').read_text().splitlines()]
        last = [e for e in ev if 'eval_mlm_loss' in e][-1]
        losses.append(dict(l1=l1, pretrain_seed=seed, **{k: last[k] for k in ('step', 'eval_mlm_loss', 'eval_mlm_loss_lo',
                                                                             'eval_mlm_loss_hi', 'eval_below_unigram')},
                           unigram_entropy=json.loads((run/'config.json').read_text())['unigram_entropy']))
        print(f"{l1} seed {seed} pre-trained at {time.time() - t0:.0f} s: {losses[-1]}", flush=True)
        r = finetune_run(run, tasks=['brown-pos'], steps=[900], seeds=(0, 1, 2), progress=False)
        rows.append(r.assign(pretrain_seed=seed, l1=l1))
        print(f"{l1} seed {seed} fine-tuned at {time.time() - t0:.0f} s", flush=True)
df = pd.concat(rows, ignore_index=True)
df.to_parquet(root/'results.parquet', index=False)
pd.DataFrame(losses).to_csv(root/'pretrain.csv', index=False)
print(df[(df.split == 'test') & df.primary].groupby(['l1', 'pretrain_seed'])['value'].agg(['mean', 'std', 'count']))
print(f"done in {time.time() - t0:.0f} s")
