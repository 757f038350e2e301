"""Shao 2020 and Nijkamp et al. 2021's objectives at equal training FLOPs over 3 pre-training seeds at a CPU size: ELECTRA, SCRIPT
and ALE pre-trained with the demo's recipe (demo_config: tiny2, sinusoidal positions, batch 32 x 64, English), pre-training seeds 0, 1, 2, each for the steps that spend the training FLOPs of the demo BERT's 900
steps (models.steps_for_equal_flops, analytic convention, at the recipe's masking rate). Each last checkpoint (the
discriminator of a pair) is fine-tuned on brown-pos with fine-tuning seeds 0, 1, 2 (max_train 2000, max_eval 500,
default hyperparameters): the same call, data and seeds as english-vs-none-cpu, whose BERT (step 900) and
no-pre-training (step 0) rows are the other arms. A rerun keeps the runs already in results.parquet and pretrain.csv."""
import sys, time, json
from pathlib import Path
import pandas as pd
import nl_embryo.analysis
from nl_embryo.demo import demo_config
from nl_embryo.models import build_model, steps_for_equal_flops, quiet_transformers
from nl_embryo.pretrain import pretrain
from nl_embryo.timeline import Run
from nl_embryo.finetune import finetune
root = Path(sys.argv[1] if len(sys.argv) > 1 else '/tmp/w/objseeds')
t0 = time.time()
ref_cfg = demo_config(str(root/'ref'))
masked = ref_cfg.resolved().mask_prob
vocab = 8000 if ref_cfg.vocab_size is None else ref_cfg.vocab_size
with quiet_transformers():
    ref = build_model('bert', ref_cfg.preset, vocab_size=vocab, max_position=ref_cfg.block_size)
    steps = {a: max(1, steps_for_equal_flops(build_model(a, ref_cfg.preset, vocab_size=vocab, max_position=ref_cfg.block_size), ref,
                                             ref_cfg.steps, ref_cfg.block_size, masked_fraction=masked)) for a in ('electra', 'script', 'ale')}
print(f"steps at the BERT's {ref_cfg.steps}-step budget (masking {masked}): {steps}", flush=True)
rows, runs = [], []
if (root/'results.parquet').exists():        # a rerun keeps what an interrupted run fine-tuned
    rows, runs = [pd.read_parquet(root/'results.parquet')], pd.read_csv(root/'pretrain.csv').to_dict('records')
done = {(r['arch'], r['pretrain_seed']) for r in runs}
for arch, n in steps.items():
    for seed in (0, 1, 2):
        if (arch, seed) in done: continue
        out = root/f'{arch}-seed{seed}'
        run_dir = Path(pretrain(demo_config(str(out), seed=seed, arch=arch, steps=n), resume=(out/'checkpoints').exists(), quiet=True))
        run = Run(run_dir)
        ev = [json.loads(l) for l in (run_dir/'metrics.jsonl').read_text().splitlines()]
        last = [e for e in ev if 'flops' in e][-1]
        runs.append(dict(arch=arch, pretrain_seed=seed, steps=run.steps()[-1], flops=last['flops'],
                         **{k: v for k, v in ev[-1].items() if k.startswith('eval_')}))
        print(f"{arch} seed {seed} pre-trained at {time.time() - t0:.0f} s: {runs[-1]}", flush=True)
        with quiet_transformers(): model, tok = run.load()
        r = finetune(model, tok, ['brown-pos'], [0, 1, 2], 2000, 500, 0, progress=False)
        rows.append(r.assign(pretrain_seed=seed, arch=arch, step=run.steps()[-1]))
        print(f"{arch} seed {seed} fine-tuned at {time.time() - t0:.0f} s", flush=True)
        pd.concat(rows, ignore_index=True).to_parquet(root/'results.parquet', index=False)
        pd.DataFrame(runs).to_csv(root/'pretrain.csv', index=False)
print(f"done in {time.time() - t0:.0f} s")
