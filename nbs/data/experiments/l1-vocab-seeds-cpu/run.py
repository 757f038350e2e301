"""Chiang and Lee 2020's vocabulary orderings over 3 pre-training seeds at a CPU size: nested-Zipf > Zipf, Zipf > no
pre-training, nested-Zipf-5000 > nested-Zipf-50, and nested-Zipf-50 with its unused embedding rows substituted
(Chiang and Lee 2020 §4.3, "50-s") > nested-Zipf-50.

The zipf, nested-zipf-50 and nested-zipf-5000 arms are pre-trained with the demo's recipe (demo_config: tiny2,
sinusoidal positions, 900 steps, 1.8M tokens), pre-training seeds 0, 1, 2, on their own corpus; all three live in the
English tokenizer's id space, so each seed's network starts from the same initialisation as the English run of that
seed. The substitute arm is each nested-zipf-50 run's step 900 after substitute_embeddings (every id its corpus does
not use gets the row of a used id, in turn). Each is fine-tuned on brown-pos with fine-tuning seeds 0, 1, 2
(max_train 2000, max_eval 500, default hyperparameters): the same call, data and seeds as english-vs-none-cpu (the
none arm) and l1-seeds-cpu (the nested-zipf arm)."""
import sys, time, json
from pathlib import Path
import numpy as np
import pandas as pd
import nl_embryo.analysis
from nl_embryo.corpora import load_corpus
from nl_embryo.demo import demo_config
from nl_embryo.finetune import finetune
from nl_embryo.interventions import substitute_embeddings
from nl_embryo.models import quiet_transformers
from nl_embryo.pretrain import pretrain
from nl_embryo.timeline import Run
root = Path(sys.argv[1] if len(sys.argv) > 1 else '/tmp/w/l1vocab')
root.mkdir(parents=True, exist_ok=True)
t0 = time.time()
rows, losses = [], []
if (root/'results.parquet').exists():        # a rerun keeps what an interrupted run fine-tuned
    rows, losses = [pd.read_parquet(root/'results.parquet')], pd.read_csv(root/'pretrain.csv').to_dict('records')
done = {(r['l1'], r['pretrain_seed']) for r in losses}
for seed in (0, 1, 2):
    for l1 in ('zipf', 'nested-zipf-50', 'nested-zipf-5000'):
        if (l1, seed) in done: continue
        out = root/f'{l1}-seed{seed}'
        cfg = demo_config(str(out), seed=seed, corpus=l1)
        run_dir = Path(pretrain(cfg, resume=(out/'checkpoints').exists(), quiet=True))
        ev = [json.loads(l) for l in (run_dir/'metrics.jsonl').read_text().splitlines()]
        last = [e for e in ev if 'eval_mlm_loss' in e][-1]
        run = Run(run_dir)
        with quiet_transformers(): model, tok = run.load(900)
        arms = [(l1, model)]
        if l1 == 'nested-zipf-50':
            used = np.unique(np.asarray(load_corpus(cfg.corpus, cfg.block_size, cfg.vocab_size, cfg.corpus_tokens, quiet=True).train))
            arms.append((f'{l1} (substitute)', substitute_embeddings(model, used)))
        info = dict(pretrain_seed=seed, **{k: last[k] for k in ('step', 'eval_mlm_loss', 'eval_mlm_loss_lo', 'eval_mlm_loss_hi', 'eval_below_unigram')},
                    unigram_entropy=json.loads((run_dir/'config.json').read_text())['unigram_entropy'])
        print(f"{l1} seed {seed} pre-trained at {time.time() - t0:.0f} s: {info}", flush=True)
        for name, m in arms:
            r = finetune(m, tok, ['brown-pos'], [0, 1, 2], 2000, 500, 0, progress=False)
            rows.append(r.assign(pretrain_seed=seed, l1=name, step=900))
            losses.append(dict(l1=name, **info))
            print(f"{name} seed {seed} fine-tuned at {time.time() - t0:.0f} s", flush=True)
        pd.concat(rows, ignore_index=True).to_parquet(root/'results.parquet', index=False)
        pd.DataFrame(losses).to_csv(root/'pretrain.csv', index=False)
df = pd.concat(rows, ignore_index=True)
print(df[(df.split == 'test') & df.primary].groupby(['l1', 'pretrain_seed'])['value'].agg(['mean', 'std', 'count']))
print(f"done in {time.time() - t0:.0f} s")
