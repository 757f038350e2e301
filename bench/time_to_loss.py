"""Time to loss: the training time and tokens until the held-out MLM loss is 0.5 nat below the corpus' unigram entropy.

nl_embryo's default recipe for a preset (pre-LN, unigram output bias, 30% masking, triangle schedule: see the
`pretrain` chapter) against the recipe a user would otherwise pick, the Hugging Face one: a post-LN `BertForMaskedLM`
of the same size (dropout 0.1), the `Trainer` with `DataCollatorForLanguageModeling` (15% masking), AdamW at 1e-3 with
6% warm-up and linear decay. Same data (the `english` corpus packed into the same blocks), same batch shape, same
threads. Precision: on a GPU both loops train in bf16; on a CPU the Trainer trains in fp32 and our loop picks its own
(bf16 autocast where the CPU computes bf16 natively); the header says which.

What is measured. A time to loss has two factors, measured apart:

- the **steps** a recipe needs to reach the target: one untimed training run per recipe (ours through
  `nl_embryo.pretrain.pretrain`, the Trainer's through `Trainer.train`), both scored by the same function on the same
  eval batches with the same fixed 15% masks every `--eval-every` steps; a run stops at the first evaluation at or
  below the target. Given the seed this does not depend on how busy the machine is (up to the order of float sums
  that another thread count gives: the runs use the timing's thread count, printed);
- the **time per step**, which a busy machine inflates, timed with `bench/interleave.py`: each recipe's training loop
  runs from the same configuration in its own long-lived worker process (this script with `--worker SPEC`; ours
  reports each step from `pretrain(on_step=...)`, the Trainer's from a callback around each step, with
  `torch.cuda.synchronize()` on a GPU), and the two take turns in short segments (A B B A ...) for `--rounds` rounds.
  Around every segment the machine's CPU counters say how much CPU other processes took; only *clean* segments (the
  others left the loops' cores free) count. A recipe's step time is the 25th percentile of its step times over clean
  segments (min and median are printed too). With `--threads auto` (default) the workers get the cores other
  processes leave free (the untimed runs then use as many).

Time to loss = steps to the target x the 25th-percentile step time (also at the min and median step times). The
ratio HF / nl_embryo is printed only when the harness accepts the ratio of the step times (at least 3 rounds with both
segments clean, per-round ratios within `--max-disagreement`); otherwise the refusal line says why (the steps ratio is
printed either way). The step times are timed first, so that `--cap-minutes` becomes a step cap per recipe (the cap
over its step time): a run that has not reached the target within its step budget or that cap counts as the time its
steps took (at most the cap), so the ratio is then a lower bound, and says so.

    python bench/time_to_loss.py [--preset tiny] [--steps 3000] [--eval-every 50] [--cap-minutes 30] [--threads auto]
                                 [--rounds 8] [--segment-s 3] [--mask-prob 0.5 --warmup 0.25] [--hf-steps 3000]

`--mask-prob` / `--warmup` change our recipe's masking rate and warm-up (the demo's tiny run used 0.5 / 0.25),
`--position-init` how our position embeddings start (tiny's recipe takes sinusoidal ones since 2026-11-25);
`--hf-steps` gives the Trainer its own step budget (its linear schedule decays over it), so that a run of ours that
gets there early does not cut the Trainer's budget short.

Prints both loops' step times, the key points of both curves (step, tokens, training seconds at the 25th-percentile
step time, eval loss, nats below the unigram entropy), the steps, tokens and time each took to reach the target, and
the ratio of the times (HF / ours; goal: at least 3x).

Measured on the project's 2-core CPU on 2026-11-27, quiet (every segment clean), with the demo's size and batch:
`python bench/time_to_loss.py --preset tiny2 --steps 900 --batch-size 32 --block-size 64 --cap-minutes 6`. Step
times (min | q25 | median): ours 0.130 | 0.138 | 0.144 s in bf16, the Trainer's 0.383 | 0.401 | 0.406 s in fp32, a
step-time ratio of 2.90x (rounds 2.31-3.04x over 8 clean rounds). Ours reached the target (6.109 nats, 0.5 below the
unigram entropy of 6.609) at step 600, 1.23M tokens, 83 s at the q25 step time; the Trainer was still 0.034 nat above
the entropy at its 898th step (360 s). Time-to-loss ratio: at least 4.34x (a lower bound: the Trainer never got
there), of which 2.90x is step time and at least 1.50x is steps.
"""
import argparse, json, math, sys, tempfile, time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from interleave import Channel, interleave, ratio, describe

FOREVER = 10**6     # the timing workers' step budget: they run until the parent stops them (a step's time does not depend on it)


class Stop(Exception):
    "Raised from our loop's step hook to end an untimed run (target reached, or its step limit)."


def eval_loss(model, batches, seed):
    "Held-out MLM loss with nl_embryo's fixed eval masks (15%, every selected token [MASK]ed, seeded per batch): the same number both loops log."
    from nl_embryo.surgery import masked_lm_loss
    was = model.training; model.eval()
    try: return masked_lm_loss(model, batches, seed, 0.15)
    finally: model.train(was)


# ---------------------------------------------------------------- the two recipes, as one configuration each
def our_config(a, out, steps, eval_every, eval_batches):
    from nl_embryo.pretrain import PretrainConfig
    return PretrainConfig(out=str(out), preset=a.preset, steps=steps, batch_size=a.batch_size, block_size=a.block_size,
                          eval_every=eval_every, eval_batches=eval_batches, checkpoints='0',
                          mask_prob=a.mask_prob, warmup=a.warmup, position_init=a.position_init)


def hf_setup(a, eval_batches):
    "The Trainer recipe's tokenizer, eval batches, model (seeded) and training blocks."
    from nl_embryo.corpora import load_corpus
    from nl_embryo.models import build_model
    from nl_embryo.pretrain import eval_batches as make_eval_batches
    corpus = load_corpus('english', block_size=a.block_size, quiet=True)
    tok = corpus.tokenizer()
    batches = make_eval_batches(corpus.eval, eval_batches, a.batch_size)
    torch.manual_seed(0)
    model = build_model('bert', a.preset, vocab_size=len(tok), max_position=a.block_size, norm='post', dropout=0.1)
    data = [{'input_ids': torch.from_numpy(np.asarray(b, dtype=np.int64))} for b in corpus.train[:a.hf_steps * a.batch_size]]
    return tok, batches, model, data


def hf_train(a, tok, model, data, callback, max_steps):
    "Train with the Trainer recipe (its schedule over `a.hf_steps`; at most `max_steps` steps), `callback` called around each step."
    from transformers import Trainer, TrainingArguments, DataCollatorForLanguageModeling, PrinterCallback
    with tempfile.TemporaryDirectory() as out:    # the Trainer wants a folder; saving is off
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=a.batch_size, max_steps=max_steps,
                                 learning_rate=1e-3, warmup_steps=max(1, round(0.06 * a.hf_steps)), lr_scheduler_type='linear',
                                 save_strategy='no', report_to='none', logging_steps=10**9, dataloader_num_workers=0,
                                 use_cpu=not torch.cuda.is_available(), bf16=torch.cuda.is_available(), disable_tqdm=True,
                                 optim='adamw_torch', seed=0)
        collator = DataCollatorForLanguageModeling(tok, mlm=True, mlm_probability=0.15)
        trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=collator, callbacks=[callback])
        trainer.remove_callback(PrinterCallback)  # no summary line of its own on stdout
        trainer.train()


# ---------------------------------------------------------------- timing workers
def ours_worker(a):
    "Our loop from the run's configuration (no evaluations), each step's time reported to the parent."
    from nl_embryo.pretrain import pretrain
    ch = Channel(warmup=3)
    with tempfile.TemporaryDirectory() as d:
        pretrain(our_config(a, Path(d)/'run', FOREVER, 0, 1), quiet=True,
                 on_step=lambda row: ch.step(row['batch_size'] * a.block_size / row['tokens_per_s']))


def hf_worker(a):
    "The Trainer recipe (no evaluations), each step's time reported to the parent."
    from transformers import TrainerCallback
    ch = Channel(warmup=3)
    tok, _, model, data = hf_setup(a, 1)
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    class Clock(TrainerCallback):
        def on_step_begin(self, *_, **k): sync(); self.t = time.perf_counter()
        def on_step_end(self, *_, **k): sync(); ch.step(time.perf_counter() - self.t)   # the step's kernels, not only their launch
    hf_train(a, tok, model, data, Clock(), FOREVER)


WORKERS = dict(ours=ours_worker, hf=hf_worker)


# ---------------------------------------------------------------- untimed runs: the steps to the target
def ours_curve(a, out, limit):
    "Our run until its eval loss is `a.margin` below the unigram entropy or `limit` steps: the curve (step, tokens, loss)."
    from nl_embryo.pretrain import pretrain
    def hook(row):
        if row.get('eval_below_unigram', -math.inf) >= a.margin or row['step'] >= limit: raise Stop
    try: pretrain(our_config(a, out, a.steps, a.eval_every, a.eval_batches), quiet=True, on_step=hook)
    except Stop: pass
    rows = [json.loads(l) for l in (out/'metrics.jsonl').read_text().splitlines()]
    info = json.loads((out/'config.json').read_text())
    curve = [(r['step'], r['tokens_seen'], r['eval_mlm_loss']) for r in rows if 'eval_mlm_loss' in r]
    c = info['config']
    recipe = (f"{c['recipe']} recipe: {c['norm']}-LN, {100 * c['mask_prob']:g}% masking, {c['schedule']} schedule, warm-up {c['warmup']:g}, "
              f"lr {c['lr']:g}, {c.get('position_init', 'random')} positions, {info.get('precision', c.get('precision'))}")
    return dict(curve=curve, last=rows[-1]['step'], unigram=info['unigram_entropy'], recipe=recipe,
                model=info['model']['cls'], n_params=info['model']['n_params'])


def hf_curve(a, target, limit):
    "The Trainer run until its eval loss reaches `target` or `limit` steps: the curve (step, tokens, loss)."
    from transformers import TrainerCallback
    tok, batches, model, data = hf_setup(a, a.eval_batches)
    curve, state = [(0, 0, eval_loss(model, batches, 0))], dict(last=0)
    class Eval(TrainerCallback):
        def on_step_end(self, args, st, control, **k):
            state['last'] = s = st.global_step
            if s % a.eval_every == 0 or s >= limit:
                loss = eval_loss(model, batches, 0)
                curve.append((s, s * a.batch_size * a.block_size, loss))
                if loss <= target: control.should_training_stop = True
            if s >= limit: control.should_training_stop = True
    hf_train(a, tok, model, data, Eval(), a.hf_steps)
    return dict(curve=curve, last=state['last'], model=type(model).__name__,
                precision='bf16' if torch.cuda.is_available() else 'fp32')


# ---------------------------------------------------------------- report
def reached(curve, target):
    "(step, tokens) of the first eval at or below `target`, or None."
    return next(((s, t) for s, t, l in curve if l <= target), None)


def show(name, curve, unigram, target, step_s):
    print(f"\n{name}: step, tokens, training s (steps x q25 step time), eval MLM loss, nats below the unigram entropy")
    keep = sorted({0, len(curve) - 1} | {int(i) for i in np.linspace(0, len(curve) - 1, 8)})
    hit = next((i for i, (_, _, l) in enumerate(curve) if l <= target), None)
    if hit is not None: keep = sorted(set(keep) | {hit})
    for i in keep:
        s, t, l = curve[i]
        secs = f"{s * step_s:8.1f}" if step_s else '     n/a'
        print(f"  {s:6d} {t:11,d} {secs} {l:7.3f} {unigram - l:+7.3f}{'   <- target' if i == hit else ''}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--preset', default='tiny'); ap.add_argument('--steps', type=int, default=3000, help='step budget of our run (and of the Trainer run unless --hf-steps)')
    ap.add_argument('--batch-size', type=int, default=32); ap.add_argument('--block-size', type=int, default=128)
    ap.add_argument('--eval-every', type=int, default=50); ap.add_argument('--eval-batches', type=int, default=8)
    ap.add_argument('--cap-minutes', type=float, default=30.0, help='training time (steps x step time) after which a run counts as the cap')
    ap.add_argument('--threads', default='auto', help="the loops' threads: a number, or auto (the cores other processes leave free)")
    ap.add_argument('--rounds', type=int, default=8); ap.add_argument('--segment-s', type=float, default=3.0)
    ap.add_argument('--max-disagreement', type=float, default=1.5, help='refuse a ratio whose per-round ratios differ by more than this factor')
    ap.add_argument('--margin', type=float, default=0.5)
    ap.add_argument('--mask-prob', type=float, default=None, help="our masking rate (default: the preset's recipe)")
    ap.add_argument('--warmup', type=float, default=None, help="our warm-up fraction (default: the preset's recipe)")
    ap.add_argument('--position-init', default=None, choices=('random', 'sinusoidal'),
                    help="how our position embeddings start (default: the preset's recipe; tiny's is sinusoidal since 2026-11-25)")
    ap.add_argument('--hf-steps', type=int, default=None, help='step budget of the Trainer run (default: --steps)')
    ap.add_argument('--worker', help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.hf_steps = a.hf_steps or a.steps
    if a.worker: return WORKERS[a.worker](a)
    dev = f"cuda ({torch.cuda.get_device_name()})" if torch.cuda.is_available() else 'cpu'
    print(f"time to loss on {dev}: preset {a.preset}, batch {a.batch_size} x {a.block_size}, budget {a.steps} steps (Trainer {a.hf_steps}), "
          f"eval every {a.eval_every} steps on {a.eval_batches} batches, target: {a.margin} nat below the unigram entropy")

    # 1. the time per step: both loops in interleaved segments (set up from the same options as the runs below)
    loops = {name: [sys.executable, __file__, *sys.argv[1:], '--worker', name] for name in WORKERS}
    print(f"\nstep times: {a.rounds} interleaved rounds of ~{a.segment_s:g} s segments; the 25th percentile over clean segments", flush=True)
    t = interleave(loops, rounds=a.rounds, segment_s=a.segment_s, threads=a.threads)
    for name in loops: print(f"  {describe(t, name)}")
    print(f"  {t.interference()}")
    r_step, line = ratio(t, 'hf', 'ours', max_disagreement=a.max_disagreement)
    print(f"  step-time ratio (HF / nl_embryo): " + (f"{r_step:.2f}x ({line})" if r_step else line), flush=True)
    st = {n: t.stats(n) for n in loops}
    q25 = {n: s['q25'] if s else None for n, s in st.items()}
    cap = 60 * a.cap_minutes
    limit = {n: min(budget, math.floor(cap / q25[n]) if q25[n] else budget) for n, budget in (('ours', a.steps), ('hf', a.hf_steps))}

    # 2. the steps to the target: untimed runs, each stopped at the target or at its step limit (budget, or the cap's steps)
    torch.set_num_threads(t.threads)
    print(f"\nsteps to the target: untimed runs on {t.threads} thread(s), at most {limit['ours']} steps (nl_embryo) and "
          f"{limit['hf']} (Trainer) (the budget or {a.cap_minutes:g} minutes of steps at the step time)", flush=True)
    with tempfile.TemporaryDirectory() as d:
        o = ours_curve(a, Path(d)/'ours', limit['ours'])
    target = o['unigram'] - a.margin
    h = hf_curve(a, target, limit['hf'])
    print(f"unigram entropy of the eval masks {o['unigram']:.3f} nats; target {target:.3f}")
    show(f"nl_embryo ({o['recipe']}, {o['model']}, {o['n_params']:,} parameters)", o['curve'], o['unigram'], target, q25['ours'])
    show(f"Hugging Face Trainer ({h['model']}, post-LN, lr 1e-3, 15% masking, {h['precision']})", h['curve'], o['unigram'], target, q25['hf'])

    # 3. time to loss = steps x step time; a run that did not get there counts as the time its steps took (at most the cap)
    print(f"\ntime to {a.margin} nat below the unigram entropy (steps x step time at its min | q25 | median):")
    res = {}
    for name, run, label, budget in (('ours', o, 'nl_embryo ', a.steps), ('hf', h, 'HF Trainer', a.hf_steps)):
        hit, s = reached(run['curve'], target), st[name]
        steps = hit[0] if hit else run['curve'][-1][0]       # not reached: the steps it trained, up to its last evaluation
        times = {k: steps * s[k] if hit else min(cap, steps * s[k]) for k in ('min', 'q25', 'median')} if s else None
        res[name] = (hit, steps, times)
        why = 'the cap' if limit[name] < budget else 'the budget'
        when = f"step {hit[0]:,} ({hit[1]:,} tokens)" if hit else f"not reached in {run['last']:,} steps ({why})"
        secs = f"{'' if hit else '> '}{times['min']:.1f} | {times['q25']:.1f} | {times['median']:.1f} s" if times else 'no clean step time'
        print(f"  {label}  {when}: {secs}")
    (ho, so, to), (hh, sh, th) = res['ours'], res['hf']
    if not ho:
        print("ratio: not comparable (nl_embryo never got there)"); return
    if so == 0:
        print("ratio: not comparable (the untrained model already meets the target: choose a larger --margin)"); return
    bound = '' if hh else ' (at least: the HF run never got there, so its time is a lower bound)'
    if r_step and to and th:
        print(f"ratio (HF / nl_embryo time to loss): {th['q25'] / to['q25']:.2f}x{bound}; steps {sh / so:.2f}x, "
              f"step time {r_step:.2f}x ({line})")
    else:
        print(f"ratio (HF / nl_embryo time to loss): {line}; steps alone: {sh / so:.2f}x{bound}")

if __name__ == '__main__':
    main()
