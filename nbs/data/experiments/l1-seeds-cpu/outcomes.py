"""English > nested-Zipf > random > no pre-training, more outcomes: two more fine-tuning tasks (sentiment, bbc-topic)
and minimal-pair accuracy per phenomenon, over the same three pre-training seeds as results.parquet.

Each nested-Zipf and random run is made again with run.py's call (demo_config(seed=S, corpus=L1)); its last eval loss
is recorded beside pretrain.csv's, so a reader sees whether these are the runs of results.parquet. Step 900 is
fine-tuned on sentiment, bbc-topic and brown-pos with fine-tuning seeds 0, 1, 2 (max_train 2000, max_eval 500, default
hyperparameters) and scored on the English minimal pairs: the calls of english-vs-none-cpu/outcomes.py, whose English
(step 900) and no-pre-training (step 0) rows are the other two arms. Ages of acquisition are not measured here: these
runs never read English, so no English word has an age in them.

    python outcomes.py ROOT [JOBS]    # JOBS: e.g. nested-zipf:0,nested-zipf:1 (one process per list, side by side);
                                      # then once more with no JOBS to join

Each job writes ROOT/L1-seedS/outcomes/; once all six are there, ROOT gets the joined outcomes.parquet,
minimal_pairs.parquet and pretrain_check.csv. In pretrain_check.csv, `minutes` is the time from the start of the job's
process to the end of that job's measurements."""
import sys, time
from pathlib import Path
import pandas as pd
import nl_embryo.analysis
from nl_embryo.demo import demo_config, run_analyses
from nl_embryo.pretrain import pretrain
from nl_embryo.finetune import finetune_run
from nl_embryo.timeline import Run
here = Path(__file__).resolve().parent
stored = pd.read_csv(here/'pretrain.csv').set_index(['l1', 'pretrain_seed'])['eval_mlm_loss']
root = Path(sys.argv[1] if len(sys.argv) > 1 else '/tmp/w/l1o')
every = [(l1, s) for l1 in ('nested-zipf', 'random') for s in (0, 1, 2)]
jobs = [(j.split(':')[0], int(j.split(':')[1])) for j in sys.argv[2].split(',')] if len(sys.argv) > 2 else []
last_eval = lambda run: Run(run).metrics().dropna(subset=['eval_mlm_loss'])['eval_mlm_loss'].iloc[-1]
t0 = time.time()
for l1, seed in jobs:
    out = root/f'{l1}-seed{seed}'
    done = out/'outcomes'
    if (done/'pretrain_check.csv').exists(): continue
    run = Path(pretrain(demo_config(str(out), seed=seed, corpus=l1), resume=(out/'checkpoints').exists(), quiet=True))
    check = dict(l1=l1, pretrain_seed=seed, eval_mlm_loss=last_eval(run), stored=stored[(l1, seed)])
    print(f"{l1} seed {seed} pre-trained at {time.time() - t0:.0f} s: {check}", flush=True)
    ft = finetune_run(run, tasks=['sentiment', 'bbc-topic', 'brown-pos'], steps=[900], seeds=(0, 1, 2), progress=False)
    print(f"{l1} seed {seed} fine-tuned at {time.time() - t0:.0f} s", flush=True)
    run_analyses(run, steps=[900], progress=False, analyses=['minimal_pairs'])
    done.mkdir(exist_ok=True)
    ft.assign(pretrain_seed=seed, l1=l1).to_parquet(done/'outcomes.parquet', index=False)
    Run(run).table('minimal_pairs').assign(pretrain_seed=seed, l1=l1).to_parquet(done/'minimal_pairs.parquet', index=False)
    pd.DataFrame([dict(check, minutes=(time.time() - t0) / 60)]).to_csv(done/'pretrain_check.csv', index=False)
    print(f"{l1} seed {seed} measured at {time.time() - t0:.0f} s", flush=True)
parts = [root/f'{l1}-seed{s}'/'outcomes' for l1, s in every]
if all((p/'pretrain_check.csv').exists() for p in parts):
    for name in ('outcomes.parquet', 'minimal_pairs.parquet'):
        pd.concat([pd.read_parquet(p/name) for p in parts], ignore_index=True).to_parquet(root/name, index=False)
    pd.concat([pd.read_csv(p/'pretrain_check.csv') for p in parts], ignore_index=True).to_csv(root/'pretrain_check.csv', index=False)
    print("joined the six runs")
