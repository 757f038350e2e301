"""Time to loss: wall time and tokens until the held-out MLM loss is 0.5 nat below the corpus' unigram entropy.

nl_embryo's default recipe for a preset (pre-LN, unigram output bias, 30% masking, triangle schedule: see the
`pretrain` chapter) against the recipe a user would otherwise pick, the Hugging Face one: a post-LN `BertForMaskedLM`
of the same size (dropout 0.1), the `Trainer` with `DataCollatorForLanguageModeling` (15% masking), AdamW at 1e-3 with
6% warm-up and linear decay. Same data (the `english` corpus packed into the same blocks), same batch shape, same
threads, one run each, one after the other. Both are scored by the same function on the same eval batches with the same
fixed 15% masks, every `--eval-every` steps; the clock counts training steps only (not the evaluations). A run that
has not reached the target within the step budget or `--cap-minutes` counts as the time it trained (at most the cap),
so the ratio is then a lower bound, and says so.

    python bench/time_to_loss.py [--preset tiny] [--steps 3000] [--eval-every 50] [--cap-minutes 30] [--threads 2]
                                 [--mask-prob 0.5 --warmup 0.25] [--hf-steps 3000]

`--mask-prob` / `--warmup` change our recipe's masking rate and warm-up (the demo's tiny run used 0.5 / 0.25),
`--position-init` how our position embeddings start (the figures below are with random ones, `--position-init random`:
tiny's recipe took sinusoidal ones on 2026-11-25, which leave the plateau earlier, so they are conservative);
`--hf-steps` gives the Trainer its own step budget (its linear schedule decays over it), so that a run of ours that
gets there early does not cut the Trainer's budget short.

Measured on 2026-11-24 on the project's 2-core CPU, quiet (`--preset tiny --steps 1000 --block-size 64 --mask-prob 0.5
--warmup 0.25 --hf-steps 3000 --cap-minutes 15`): nl_embryo 197.8 s (1,433,600 tokens, step 700); the Trainer not
there after its 15-minute cap (0.018 nat below at step 1,550): ratio at least 4.55x.

Prints the key points of both curves (step, tokens, training seconds, eval loss, nats below the unigram entropy), the
time and tokens each took to reach the target, and the ratio of wall times (HF / ours; goal: at least 3x).
"""
import argparse, json, math, tempfile, time
from pathlib import Path

import numpy as np
import torch


def eval_loss(model, batches, seed):
    "Held-out MLM loss with nl_embryo's fixed eval masks (15%, every selected token [MASK]ed, seeded per batch): the same number both loops log."
    from nl_embryo.surgery import masked_lm_loss
    was = model.training; model.eval()
    try: return masked_lm_loss(model, batches, seed, 0.15)
    finally: model.train(was)


def ours(a, out):
    "nl_embryo's loop with the preset's recipe; the curve from its metrics (training time = the sum of the logged step times)."
    from nl_embryo.pretrain import PretrainConfig, pretrain
    cfg = PretrainConfig(out=str(out), preset=a.preset, steps=a.steps, batch_size=a.batch_size, block_size=a.block_size,
                         eval_every=a.eval_every, eval_batches=a.eval_batches, checkpoints=f'0,{a.steps}',
                         mask_prob=a.mask_prob, warmup=a.warmup, position_init=a.position_init)
    t0 = time.perf_counter()
    run = pretrain(cfg, quiet=True)
    wall = time.perf_counter() - t0
    rows = [json.loads(l) for l in (run/'metrics.jsonl').read_text().splitlines()]
    info = json.loads((run/'config.json').read_text())
    clock, curve = 0.0, []
    for r in rows:
        if r['step'] > 0: clock += r['batch_size'] * a.block_size / r['tokens_per_s']
        if 'eval_mlm_loss' in r: curve.append((r['step'], r['tokens_seen'], clock, r['eval_mlm_loss']))
    c = info['config']
    recipe = (f"{c['recipe']} recipe: {c['norm']}-LN, {100 * c['mask_prob']:g}% masking, {c['schedule']} schedule, warm-up {c['warmup']:g}, "
              f"lr {c['lr']:g}, {c.get('position_init', 'random')} positions")
    return dict(curve=curve, unigram=info['unigram_entropy'], recipe=recipe, wall=wall,
                model=info['model']['cls'], n_params=info['model']['n_params'])


def hugging_face(a, target):
    "The Trainer recipe, stopped once the target is reached (or at the step budget or the time cap)."
    from transformers import Trainer, TrainingArguments, DataCollatorForLanguageModeling, TrainerCallback
    from nl_embryo.corpora import load_corpus
    from nl_embryo.models import build_model
    from nl_embryo.pretrain import eval_batches
    corpus = load_corpus('english', block_size=a.block_size, quiet=True)
    tok = corpus.tokenizer(); V = len(tok)
    batches = eval_batches(corpus.eval, a.eval_batches, a.batch_size)
    torch.manual_seed(0)
    model = build_model('bert', a.preset, vocab_size=V, max_position=a.block_size, norm='post', dropout=0.1)
    data = [{'input_ids': torch.from_numpy(np.asarray(b, dtype=np.int64))} for b in corpus.train[:a.hf_steps * a.batch_size]]
    curve = [(0, 0, 0.0, eval_loss(model, batches, 0))]
    state = dict(clock=0.0)

    class Clock(TrainerCallback):
        def on_step_begin(self, args, st, control, **k): state['t'] = time.perf_counter()
        def on_step_end(self, args, st, control, **k):
            state['clock'] += time.perf_counter() - state['t']
            if st.global_step % a.eval_every == 0 or st.global_step == a.hf_steps:
                loss = eval_loss(model, batches, 0)
                curve.append((st.global_step, st.global_step * a.batch_size * a.block_size, state['clock'], loss))
                if loss <= target or state['clock'] > 60 * a.cap_minutes: control.should_training_stop = True
    out = tempfile.TemporaryDirectory()           # the Trainer wants a folder; saving is off, and it is removed at the end
    args = TrainingArguments(output_dir=out.name, per_device_train_batch_size=a.batch_size, max_steps=a.hf_steps,
                             learning_rate=1e-3, warmup_steps=max(1, round(0.06 * a.hf_steps)), lr_scheduler_type='linear', save_strategy='no',
                             report_to='none', logging_steps=10**9, dataloader_num_workers=0, use_cpu=True, disable_tqdm=True,
                             optim='adamw_torch', seed=0)
    collator = DataCollatorForLanguageModeling(tok, mlm=True, mlm_probability=0.15)
    with out: Trainer(model=model, args=args, train_dataset=data, data_collator=collator, callbacks=[Clock()]).train()
    return dict(curve=curve, model=type(model).__name__)


def reached(curve, target):
    "(step, tokens, seconds) of the first eval at or below `target`, or None."
    return next(((s, t, c) for s, t, c, l in curve if l <= target), None)


def show(name, curve, unigram, target):
    print(f"\n{name}: step, tokens, training s, eval MLM loss, nats below the unigram entropy")
    keep = sorted({0, len(curve) - 1} | {int(i) for i in np.linspace(0, len(curve) - 1, 8)})
    hit = next((i for i, (_, _, _, l) in enumerate(curve) if l <= target), None)
    if hit is not None: keep = sorted(set(keep) | {hit})
    for i in keep:
        s, t, c, l = curve[i]
        print(f"  {s:6d} {t:11,d} {c:8.1f} {l:7.3f} {unigram - l:+7.3f}{'   <- target' if i == hit else ''}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--preset', default='tiny'); ap.add_argument('--steps', type=int, default=3000, help='step budget of our run (and of the Trainer run unless --hf-steps)')
    ap.add_argument('--batch-size', type=int, default=32); ap.add_argument('--block-size', type=int, default=128)
    ap.add_argument('--eval-every', type=int, default=50); ap.add_argument('--eval-batches', type=int, default=8)
    ap.add_argument('--cap-minutes', type=float, default=30.0, help='training time after which a run counts as the cap')
    ap.add_argument('--threads', type=int, default=2); ap.add_argument('--margin', type=float, default=0.5)
    ap.add_argument('--mask-prob', type=float, default=None, help="our masking rate (default: the preset's recipe)")
    ap.add_argument('--warmup', type=float, default=None, help="our warm-up fraction (default: the preset's recipe)")
    ap.add_argument('--position-init', default=None, choices=('random', 'sinusoidal'),
                    help="how our position embeddings start (default: the preset's recipe; tiny's is sinusoidal since 2026-11-25)")
    ap.add_argument('--hf-steps', type=int, default=None, help='step budget of the Trainer run (default: --steps)')
    a = ap.parse_args()
    a.hf_steps = a.hf_steps or a.steps
    torch.set_num_threads(a.threads)
    print(f"time to loss on {a.threads} thread(s): preset {a.preset}, batch {a.batch_size} x {a.block_size}, budget {a.steps} steps (Trainer {a.hf_steps}), "
          f"eval every {a.eval_every} steps on {a.eval_batches} batches, target: {a.margin} nat below the unigram entropy")
    with tempfile.TemporaryDirectory() as d:
        o = ours(a, Path(d)/'ours')
    target = o['unigram'] - a.margin
    cap = 60 * a.cap_minutes
    h = hugging_face(a, target)
    print(f"unigram entropy of the eval masks {o['unigram']:.3f} nats; target {target:.3f}")
    show(f"nl_embryo ({o['recipe']}, {o['model']}, {o['n_params']:,} parameters)", o['curve'], o['unigram'], target)
    show(f"Hugging Face Trainer ({h['model']}, post-LN, lr 1e-3, 15% masking)", h['curve'], o['unigram'], target)
    ro, rh = reached(o['curve'], target), reached(h['curve'], target)
    # a run that did not get there counts as the time it trained without getting there (at most the cap): a lower bound
    hit = lambda r: r is not None and r[2] <= cap
    to = ro[2] if hit(ro) else min(cap, o['curve'][-1][2])
    th = rh[2] if hit(rh) else min(cap, h['curve'][-1][2])
    fmt = lambda r, t: f"{t:7.1f} s, {r[1]:,} tokens (step {r[0]})" if hit(r) else f"> {t:5.1f} s (not reached in the budget)"
    print(f"\ntime to {a.margin} nat below the unigram entropy:\n  nl_embryo     {fmt(ro, to)}\n  HF Trainer    {fmt(rh, th)}")
    bound = '' if hit(rh) and hit(ro) else (' (at least: the HF run never got there, so its time is a lower bound)' if hit(ro) else ' (not comparable: nl_embryo never got there)')
    print(f"ratio (HF / nl_embryo wall time): {th / to:.2f}x{bound}")


if __name__ == '__main__':
    main()
