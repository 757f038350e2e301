"""Induction-head budget: how many tokens of English a causal embryo needs before an induction head appears.

Pre-trains a causal model (default: the gpt-neox `tiny` preset on the `english` corpus, longer blocks than the CPU demo's)
with a log-spaced timeline, then scores every checkpoint's heads on repeated random tokens (`induction_scores`: a 95%
bootstrap interval over the sequences and the chance level) and applies the same onset rule as the report
(`causal_head_phases`: the first checkpoint where some head's interval's lower end reaches 2 x chance; a head can lose
it again, so read the printed curve too).
Prints, per checkpoint, the held-out next-token loss, the epochs of the corpus seen so far and the best head's induction
and previous-token scores with their intervals, then the onsets in steps and tokens. `--minutes` caps the training
time: the run stops after the first checkpoint past it (its learning-rate schedule stays that of `--steps`) and the
checkpoints written so far are scored. A GPU makes the longer budgets practical; on a CPU use a smaller `--steps`.

    python bench/induction_budget.py [--arch gpt-neox] [--preset tiny] [--corpus english] [--steps 4000] [--batch-size 64]
                                     [--block-size 128] [--seed 0] [--minutes M] [--save scores.csv] [--save-metrics metrics.jsonl]
"""
import argparse, shutil, tempfile, time
from pathlib import Path

import pandas as pd
import torch


class TimeUp(Exception):
    "The training-time cap was reached (raised from the loop's step hook, right after a checkpoint was written)."


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--arch', default='gpt-neox'); ap.add_argument('--preset', default='tiny')
    ap.add_argument('--corpus', default='english', help="a corpus of nl_embryo, e.g. english-repeat (half its sentences repeated at once), "
                    "zipf-repeat (copy segments only) or english-copy-75 (English with copy segments as 75%% of its train tokens)")
    ap.add_argument('--seed', type=int, default=0, help='the pre-training seed (model, data order)')
    ap.add_argument('--steps', type=int, default=4000); ap.add_argument('--batch-size', type=int, default=64)
    ap.add_argument('--block-size', type=int, default=128); ap.add_argument('--checkpoints', default='log:512:500')
    ap.add_argument('--lr', type=float, default=None, help="peak learning rate (default: the preset's recipe)")
    ap.add_argument('--minutes', type=float, default=None, help='stop training after the first checkpoint past this many minutes')
    ap.add_argument('--n-seqs', type=int, default=64, help='random repeated sequences per checkpoint')
    ap.add_argument('--save', help='write the per-head scores of every checkpoint to this CSV file')
    ap.add_argument('--save-metrics', help="copy the run's metrics.jsonl (losses per step) to this file")
    ap.add_argument('--out', help='the run folder (default: a temporary one, removed at the end)')
    a = ap.parse_args()
    from nl_embryo.pretrain import PretrainConfig, pretrain, checkpoint_steps
    from nl_embryo.checkpoints import list_checkpoints, load_trained_model
    from nl_embryo.attention import induction_scores, causal_head_phases
    from nl_embryo.corpora import load_corpus
    dev = 'cuda' if torch.cuda.is_available() else 'cpu'
    ck = set(checkpoint_steps(a.checkpoints, a.steps))
    t0 = time.perf_counter()
    def cap(row):
        if a.minutes is not None and time.perf_counter() - t0 > 60 * a.minutes and row['step'] - 1 in ck and row['step'] - 1 > 0:
            raise TimeUp(row['step'] - 1)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(a.out or Path(tmp)/'run')
        extra = {} if a.lr is None else dict(lr=a.lr)
        stopped = None
        try:
            run = pretrain(PretrainConfig(out=str(out), arch=a.arch, preset=a.preset, corpus=a.corpus, steps=a.steps,
                                          batch_size=a.batch_size, block_size=a.block_size, checkpoints=a.checkpoints, seed=a.seed,
                                          eval_every=max(1, a.steps // 10), **extra), quiet=True, on_step=cap)
        except TimeUp as e: run, stopped = out, e.args[0]
        t_train = time.perf_counter() - t0
        metrics = pd.read_json(run/'metrics.jsonl', lines=True)
        if a.save_metrics: shutil.copy(run/'metrics.jsonl', a.save_metrics)
        frames = []
        for step, path in list_checkpoints(run, warn=False).items():   # each checkpoint's rows saved as they come: a cut-off run keeps them
            model = load_trained_model(path).to(dev).eval()
            frames.append(induction_scores(model, n_seqs=a.n_seqs).assign(step=step))
            if a.save: frames[-1].to_csv(a.save, mode='a' if len(frames) > 1 else 'w', header=len(frames) == 1, index=False)
        scores = pd.concat(frames, ignore_index=True)
    tokens = a.batch_size * a.block_size
    corpus_tokens = len(load_corpus(a.corpus, block_size=a.block_size, quiet=True).train) * a.block_size
    done = stopped if stopped is not None else a.steps
    print(f"{a.arch} {a.preset} on {dev}: {done} steps of {a.batch_size} x {a.block_size} tokens ({done * tokens:,} tokens, "
          f"{done * tokens / corpus_tokens:.1f} epochs of the {corpus_tokens:,}-token {a.corpus} train split) trained in {t_train:.0f} s"
          + (f" (stopped by --minutes {a.minutes:g}; the schedule is that of {a.steps} steps)" if stopped is not None else '')
          + f"; scores on {a.n_seqs} repeated random sequences")
    best = scores.loc[scores.groupby(['step', 'pattern'])['lo'].idxmax()]
    table = best.pivot_table(index='step', columns='pattern', values=['value', 'lo', 'chance'])
    loss_col = next(c for c in ('eval_clm_loss', 'eval_mlm_loss') if c in metrics)
    table[('eval loss', '')] = metrics.dropna(subset=[loss_col]).set_index('step')[loss_col].reindex(table.index)
    table[('epochs', '')] = table.index * tokens / corpus_tokens
    print(table.round(3).to_string())
    for r in causal_head_phases(scores):
        at = f"step {r['step']} ({r['step'] * tokens:,} tokens)" if r['step'] is not None else f"not reached by step {done}"
        print(f"{r['phase']}: {at}; bar {r['reference']:.3f} (2 x chance), score there {r['value']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}]")


if __name__ == '__main__':
    main()
