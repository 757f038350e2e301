"""English vs no pre-training, more outcomes: two more fine-tuning tasks (sentiment, bbc-topic) and two intrinsic
measures (minimal-pair accuracy per phenomenon, age of acquisition of function vs content words), over the same three
pre-training seeds as results.parquet.

Each seed's run is the demo's recipe again (demo_config(seed=S): tiny2, sinusoidal positions, 900 steps, 1.8M tokens of
English); its last eval loss is recorded beside the stored run's (nbs/data/demo, nbs/data/demo-seeds/seedS). The runs
are made again, not read back, so they are not bit for bit those of results.parquet: brown-pos is fine-tuned again on
them too. Steps 0 (no pre-training) and 900 (English) are fine-tuned on sentiment and bbc-topic, then on brown-pos, with
fine-tuning seeds 0, 1, 2 (max_train 2000, max_eval 500, default hyperparameters): the call of results.parquet. The
minimal pairs are scored at steps 0 and 900; the ages of acquisition are fitted over every checkpoint.

    python outcomes.py ROOT [SEEDS]    # SEEDS: e.g. 1 (one process per seed, run side by side); then once more to join

Each seed writes ROOT/seedS/outcomes/; once all three are there, ROOT gets the joined outcomes.parquet,
minimal_pairs.parquet, acquisition.parquet and pretrain_check.csv. In pretrain_check.csv, `minutes` is the time from
the start of the seed's process to the end of that seed's measurements (seed 0's 50.9 includes its step-0 fine-tunes
made twice: its process was restarted)."""
import sys, time, json
from pathlib import Path
import pandas as pd
import nl_embryo.analysis
from nl_embryo.demo import demo_config, run_analyses
from nl_embryo.pretrain import pretrain
from nl_embryo.finetune import finetune_run
from nl_embryo.checkpoints import list_checkpoints
from nl_embryo.timeline import Run
here = Path(__file__).resolve().parent
stored = {0: here.parents[1]/'demo', 1: here.parents[1]/'demo-seeds'/'seed1', 2: here.parents[1]/'demo-seeds'/'seed2'}
root = Path(sys.argv[1] if len(sys.argv) > 1 else '/tmp/w/evn')
seeds = [int(s) for s in (sys.argv[2] if len(sys.argv) > 2 else '0,1,2').split(',') if s]
last_eval = lambda run: Run(run).metrics().dropna(subset=['eval_mlm_loss'])['eval_mlm_loss'].iloc[-1]
t0 = time.time()
for seed in seeds:
    out, done = root/f'seed{seed}', root/f'seed{seed}'/'outcomes'
    if (done/'acquisition.parquet').exists(): continue
    run = Path(pretrain(demo_config(str(out), seed=seed), resume=(out/'checkpoints').exists(), quiet=True))
    check = dict(pretrain_seed=seed, eval_mlm_loss=last_eval(run), stored=last_eval(stored[seed]), minutes=(time.time() - t0) / 60)
    print(f"seed {seed} pre-trained at {time.time() - t0:.0f} s: {check}", flush=True)
    new = finetune_run(run, tasks=['sentiment', 'bbc-topic'], steps=[0, 900], seeds=(0, 1, 2), progress=False)
    pos = finetune_run(run, tasks=['brown-pos'], steps=[0, 900], seeds=(0, 1, 2), progress=False)
    print(f"seed {seed} fine-tuned at {time.time() - t0:.0f} s", flush=True)
    run_analyses(run, steps=[0, 900], progress=False, analyses=['minimal_pairs'])
    run_analyses(run, steps=list(list_checkpoints(run, warn=False)), progress=False, analyses=['acquisition'])
    done.mkdir(exist_ok=True)
    pd.concat([new, pos], ignore_index=True).assign(pretrain_seed=seed).to_parquet(done/'outcomes.parquet', index=False)
    Run(run).table('minimal_pairs').assign(pretrain_seed=seed).to_parquet(done/'minimal_pairs.parquet', index=False)
    pd.DataFrame([dict(check, minutes=(time.time() - t0) / 60)]).to_csv(done/'pretrain_check.csv', index=False)
    Run(run).table('acquisition').assign(pretrain_seed=seed).to_parquet(done/'acquisition.parquet', index=False)
    print(f"seed {seed} measured at {time.time() - t0:.0f} s", flush=True)
parts = [root/f'seed{s}'/'outcomes' for s in (0, 1, 2)]
if all((p/'acquisition.parquet').exists() for p in parts):
    for name in ('outcomes.parquet', 'minimal_pairs.parquet', 'acquisition.parquet'):
        pd.concat([pd.read_parquet(p/name) for p in parts], ignore_index=True).to_parquet(root/name, index=False)
    pd.concat([pd.read_csv(p/'pretrain_check.csv') for p in parts], ignore_index=True).to_csv(root/'pretrain_check.csv', index=False)
    print("joined the three seeds")
