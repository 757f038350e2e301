"""Induction-head budget: how many tokens of English a causal embryo needs before an induction head appears.

Pre-trains a causal model (default: the gpt-neox `tiny` preset on the `english` corpus, longer blocks than the CPU demo's)
with a log-spaced timeline, then scores every checkpoint's heads on repeated random tokens (`induction_scores`: a 95%
bootstrap interval over the sequences and the chance level) and applies the same onset rule as the report
(`causal_head_phases`: the first checkpoint where some head's interval's lower end reaches 2 x chance and stays there).
Prints, per checkpoint, the best head's induction and previous-token scores with their intervals, then the onsets in
steps and tokens. A GPU makes the longer budgets practical; on a CPU use a smaller `--steps`.

    python bench/induction_budget.py [--arch gpt-neox] [--preset tiny] [--steps 4000] [--batch-size 64] [--block-size 128]
                                     [--save scores.csv]
"""
import argparse, tempfile, time
from pathlib import Path

import pandas as pd
import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--arch', default='gpt-neox'); ap.add_argument('--preset', default='tiny')
    ap.add_argument('--steps', type=int, default=4000); ap.add_argument('--batch-size', type=int, default=64)
    ap.add_argument('--block-size', type=int, default=128); ap.add_argument('--checkpoints', default='log:512:500')
    ap.add_argument('--lr', type=float, default=None, help="peak learning rate (default: the preset's recipe)")
    ap.add_argument('--n-seqs', type=int, default=64, help='random repeated sequences per checkpoint')
    ap.add_argument('--save', help='write the per-head scores of every checkpoint to this CSV file')
    ap.add_argument('--out', help='the run folder (default: a temporary one, removed at the end)')
    a = ap.parse_args()
    from nl_embryo.pretrain import PretrainConfig, pretrain
    from nl_embryo.checkpoints import list_checkpoints, load_trained_model
    from nl_embryo.attention import induction_scores, causal_head_phases
    dev = 'cuda' if torch.cuda.is_available() else 'cpu'
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(a.out or Path(tmp)/'run')
        extra = {} if a.lr is None else dict(lr=a.lr)
        t0 = time.perf_counter()
        run = pretrain(PretrainConfig(out=str(out), arch=a.arch, preset=a.preset, corpus='english', steps=a.steps,
                                      batch_size=a.batch_size, block_size=a.block_size, checkpoints=a.checkpoints,
                                      eval_every=max(1, a.steps // 10), **extra), quiet=True)
        t_train = time.perf_counter() - t0
        frames = []
        for step, path in list_checkpoints(run, warn=False).items():
            model = load_trained_model(path).to(dev).eval()
            frames.append(induction_scores(model, n_seqs=a.n_seqs).assign(step=step))
        scores = pd.concat(frames, ignore_index=True)
    tokens = a.batch_size * a.block_size
    print(f"{a.arch} {a.preset} on {dev}: {a.steps} steps of {a.batch_size} x {a.block_size} tokens "
          f"({a.steps * tokens:,} tokens) trained in {t_train:.0f} s; scores on {a.n_seqs} repeated random sequences")
    best = scores.loc[scores.groupby(['step', 'pattern'])['lo'].idxmax()]
    table = best.pivot_table(index='step', columns='pattern', values=['value', 'lo', 'chance'])
    print(table.round(3).to_string())
    for r in causal_head_phases(scores):
        at = f"step {r['step']} ({r['step'] * tokens:,} tokens)" if r['step'] is not None else f"not reached by step {a.steps}"
        print(f"{r['phase']}: {at}; bar {r['reference']:.3f} (2 x chance), score there {r['value']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}]")
    if a.save: scores.to_csv(a.save, index=False)


if __name__ == '__main__':
    main()
