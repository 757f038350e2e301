"""Foreign first languages over 3 pre-training seeds at a CPU size: Zhang 2021's foreign model on English (Tables 3 and
5) and Chiang and Lee 2020's code model adapted to English (§4.4).

The demo's recipe (demo_config: tiny2, sinusoidal positions, 900 steps, batch 32 x 64) pre-trains, with seeds 0, 1, 2,
an English run (the runs of english-vs-none-cpu, pre-trained again: the recipe is deterministic), a Talmud run and a
code run, each of the two with its own tokenizer. The arms, each fine-tuned on brown-pos with fine-tuning seeds 0, 1, 2
(max_train 2000, max_eval 500, default hyperparameters; the same call, data and seeds as english-vs-none-cpu, whose
original (step 900) and none (step 0: no pre-training) rows are the reused arms):
- talmud: the Talmud model with its own tokenizer;
- talmud + English embeddings: its word embeddings swapped for the English run's of the same seed (swap_embeddings);
- talmud, clean English embeddings: the English tokenizer with re-initialised word embeddings (adopt_tokenizer);
- code: the code model with the English tokenizer and re-initialised word embeddings (adopt_tokenizer);
- code (adapted): that model after 100 steps of English MLM on its word embeddings and head alone (mlm_adapt, batch
  32 x 64, lr 1e-3, seed 0)."""
import sys, time, json
from pathlib import Path
import pandas as pd
import nl_embryo.analysis
from nl_embryo.demo import demo_config
from nl_embryo.finetune import adopt_tokenizer, finetune, mlm_adapt
from nl_embryo.interventions import swap_embeddings
from nl_embryo.models import quiet_transformers
from nl_embryo.pretrain import pretrain
from nl_embryo.timeline import Run
root = Path(sys.argv[1] if len(sys.argv) > 1 else '/tmp/w/foreign')
root.mkdir(parents=True, exist_ok=True)
t0 = time.time()
rows, runs = [], []
if (root/'results.parquet').exists():        # a rerun keeps what an interrupted run fine-tuned
    rows, runs = [pd.read_parquet(root/'results.parquet')], pd.read_csv(root/'pretrain.csv').to_dict('records')
done = {(r['l1'], r['pretrain_seed']) for r in runs}

def trained(corpus, seed):
    "The step-900 model and tokenizer of the demo's recipe on `corpus` with pre-training seed `seed` (pre-trained here once)."
    out = root/f'{corpus}-seed{seed}'
    run_dir = Path(pretrain(demo_config(str(out), seed=seed, corpus=corpus), resume=(out/'checkpoints').exists(), quiet=True))
    ev = [json.loads(l) for l in (run_dir/'metrics.jsonl').read_text().splitlines()]
    last = [e for e in ev if 'eval_mlm_loss' in e][-1]
    if (corpus, seed) not in done:
        runs.append(dict(l1=corpus, pretrain_seed=seed, **{k: last[k] for k in ('step', 'eval_mlm_loss', 'eval_below_unigram')}))
        done.add((corpus, seed))
    print(f"{corpus} seed {seed} pre-trained at {time.time() - t0:.0f} s", flush=True)
    with quiet_transformers(): return Run(run_dir).load(900)

def tune(name, seed, model, tok):
    r = finetune(model, tok, ['brown-pos'], [0, 1, 2], 2000, 500, 0, progress=False)
    rows.append(r.assign(pretrain_seed=seed, l1=name, step=900))
    pd.concat(rows, ignore_index=True).to_parquet(root/'results.parquet', index=False)
    pd.DataFrame(runs).to_csv(root/'pretrain.csv', index=False)
    print(f"{name} seed {seed} fine-tuned at {time.time() - t0:.0f} s", flush=True)

have = set() if not rows else set(zip(rows[0]['l1'], rows[0]['pretrain_seed']))
for group in ('talmud', 'code'):           # the Talmud arms first: each group's three seeds complete its orderings
    for seed in (0, 1, 2):
        english, etok = trained('english', seed)
        model, tok = trained(group, seed)
        cfg = demo_config('unused')
        arms = ({'talmud': lambda: (model, tok), 'talmud + English embeddings': lambda: (swap_embeddings(model, english, etok), etok),
                 'talmud, clean English embeddings': lambda: (adopt_tokenizer(model, etok), etok)} if group == 'talmud' else
                {'code': lambda: (adopt_tokenizer(model, etok), etok),
                 'code (adapted)': lambda: (mlm_adapt(adopt_tokenizer(model, etok), 'english', 100, cfg.batch_size, 1e-3, cfg.block_size,
                                                      cfg.vocab_size, progress=False), etok)})
        for name, make in arms.items():
            if (name, seed) not in have: tune(name, seed, *make())
print(f"done in {time.time() - t0:.0f} s")
