"""Where a training step's time goes: torch.profiler over steps of nl_embryo's loop, the operators grouped by what they do.

Runs the loop (`pretrain`, `english` corpus, the preset's recipe at 15% masking) and profiles `--active` steps after
`--wait` + 1 warm-up steps, through the loop's `on_step` hook. Each operator's own (self) CPU time is put in one group:
the dense layers' products (Q, K, V, output and feed-forward), the attention products (scores and weighted sums), the
MLM output layer (products whose shape has the vocabulary size), softmax, norms, activations, dropout, the optimizer
(fused AdamW and zeroing the gradients), casts between precisions, and the rest (masking and data, the loss, element-wise
arithmetic of the backward, ...). Prints milliseconds per step and the share of each, and next to it the step's
matmul FLOPs by part from the FLOPs counter. On a GPU it also prints each group's kernel time and how long, per step,
the GPU waited for the host (the step's wall time, from the loop's end-of-step sync, less the kernels' time); the
least time those kernels' own traffic allows is `step_traffic.py`'s.

    python bench/profile_step.py [--preset small] [--precision bf16] [--batch-size 32] [--block-size 128] [--save profile.csv]
"""
import argparse, re, tempfile, time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch.profiler import profile, schedule, ProfilerActivity
from torch.autograd import DeviceType

GROUPS = [   # (group, operator-name pattern); the first match wins; 'head' and 'attention products' are found by shape first
    ('softmax', r'softmax'), ('norms', r'layer_norm'), ('activations', r'gelu|silu|tanh'),
    ('dropout', r'dropout|bernoulli'), ('optimizer', r'adam|zero_|foreach|_fused'),
    ('casts', r'^aten::(copy_|_to_copy|to)$'),
    ('dense layers', r'^aten::(addmm|mm|linear|matmul)$'), ('attention products', r'^aten::(bmm|baddbmm)$|attention'),
]


def group_of(name: str, shapes, vocab: int) -> str:
    if re.search(r'mm|matmul|linear', name) and any(vocab in (s or []) for s in shapes): return 'MLM output layer'
    for g, pat in GROUPS:
        if re.search(pat, name): return g
    return 'other (masking, data, loss, element-wise)'


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--preset', default='small'); ap.add_argument('--precision', default='bf16')
    ap.add_argument('--batch-size', type=int, default=32); ap.add_argument('--block-size', type=int, default=128)
    ap.add_argument('--wait', type=int, default=2); ap.add_argument('--active', type=int, default=4)
    ap.add_argument('--save', help='write the table as CSV to this file')
    a = ap.parse_args()
    from nl_embryo.pretrain import PretrainConfig, pretrain
    from nl_embryo.models import build_model, flops_per_token
    total = a.wait + 1 + a.active
    cuda = torch.cuda.is_available()
    stamps = []
    def hook(row): stamps.append(time.perf_counter()); prof.step()          # the loop syncs at the end of each step: the stamps are its ends
    with tempfile.TemporaryDirectory() as d, profile(activities=[ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * cuda, record_shapes=True,
                                                     schedule=schedule(wait=a.wait, warmup=1, active=a.active)) as prof:
        run = pretrain(PretrainConfig(out=str(Path(d)/'run'), preset=a.preset, corpus='english', steps=total + 1, batch_size=a.batch_size,
                                      block_size=a.block_size, checkpoints='0', eval_batches=1, mask_prob=0.15, precision=a.precision),
                       quiet=True, on_step=hook)
        vocab = build_model('bert', a.preset, device='meta').config.vocab_size
    # an operator's self device time: the kernels it launched itself (not through the operators it called)
    device_us = lambda e: getattr(e, 'self_device_time_total', None) or getattr(e, 'self_cuda_time_total', 0)
    rows = [dict(group=group_of(e.key, e.input_shapes, vocab), ms=e.self_cpu_time_total / 1e3 / a.active,
                 **(dict(device_ms=device_us(e) / 1e3 / a.active) if cuda else {}))
            for e in prof.key_averages(group_by_input_shape=True)
            if getattr(e, 'device_type', DeviceType.CPU) == DeviceType.CPU]       # operators: a kernel's own row would count it twice
    t = pd.DataFrame(rows).groupby('group', as_index=False).sum().sort_values('device_ms' if cuda else 'ms', ascending=False)
    t['share'] = t['ms'] / t['ms'].sum()
    if cuda: t['device_share'] = t['device_ms'] / t['device_ms'].sum()
    print(f"{a.preset} {a.precision}, batch {a.batch_size} x {a.block_size}, {torch.get_num_threads()} threads: "
          f"self CPU time{' and GPU kernel time' if cuda else ''} per step by group ({a.active} profiled steps)")
    print(t.to_string(index=False, formatters=dict(ms='{:,.1f}'.format, share='{:.1%}'.format, device_ms='{:,.1f}'.format,
                                                   device_share='{:.1%}'.format)))
    if cuda:
        wall = float(np.median(np.diff(stamps[a.wait + 1:]))) * 1e3                  # the steps after the warm-up, profiled or not
        busy = t['device_ms'].sum()
        print(f"GPU kernels ran {busy:.1f} ms of a {wall:.1f} ms step (median of {len(stamps) - a.wait - 2} steps under the profiler): "
              f"the GPU waited {max(0.0, wall - busy):.1f} ms ({max(0.0, 1 - busy / wall):.0%}) for the host")
    f = flops_per_token(build_model('bert', a.preset, device='meta'), a.block_size, masked_fraction=0.15)
    print("\nforward matmul FLOPs per token by part (the counter):", {k: f"{v / f['total']:.1%}" for k, v in f.items() if k != 'total'})
    if a.save: t.assign(preset=a.preset, precision=a.precision, threads=torch.get_num_threads()).to_csv(a.save, index=False)


if __name__ == '__main__':
    main()
