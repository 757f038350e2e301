"""How far `training_memory`'s lower bound sits below the memory a training step really takes, on the CPU.

For each configuration (architecture, preset, block, micro-batch, precision, attention kernel) a fresh process builds
the model and its AdamW optimizer, reads its resident memory, then runs one training step as `pretrain` does (the run's
objective, under bf16 autocast where asked, backward, optimizer step) and reads its peak resident memory. The step's
figure is the peak minus the resident memory before the step, less the weights that were already there; the bound's is
`training_memory(...)['total']` less the same weights. Their ratio must be at least 1 (a bound that is not below the
step would refuse runs that fit); `pretrain`'s refusal suggests micro-batches and blocks whose bound takes at most half
of the free memory, because the ratio is well above 1.

    python bench/training_memory.py [--configs all|quick] [--save FILE.csv]
    python bench/training_memory.py --one ARCH PRESET BLOCK MICRO BF16 ATTENTION    (one measurement, as JSON)
"""
import argparse, json, resource, subprocess, sys
from pathlib import Path

CONFIGS = {  # arch, preset, block, micro, bf16, attention
    'quick': [('bert', 'mini', 256, 4, 0, 'sdpa')],
    'all': [('bert', 'tiny2', 512, 8, 1, 'eager'), ('bert', 'tiny2', 512, 8, 0, 'sdpa'), ('bert', 'small', 256, 16, 1, 'eager'),
            ('bert', 'mini', 2048, 4, 1, 'eager'), ('gpt-neox', 'tiny2', 512, 8, 1, 'eager'), ('gpt-neox', 'mini', 256, 8, 0, 'sdpa'),
            ('electra', 'tiny', 256, 8, 1, 'eager')],
}


def one(arch, preset, block, micro, bf16, attention):
    import torch
    from nl_embryo.models import build_model, set_attention, is_pair, CAUSAL_ARCHS
    from nl_embryo.objectives import OBJECTIVES, step_generator
    from nl_embryo.pretrain import training_memory
    torch.manual_seed(0)
    model = build_model(arch, preset, vocab_size=8000, max_position=block); set_attention(model, attention)
    objective = 'clm' if arch in CAUSAL_ARCHS else 'electra' if is_pair(model) else 'mlm'
    opt = torch.optim.AdamW(model.parameters())
    rss = lambda: next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmRSS')) * 1024
    before = rss()
    ids = torch.randint(5, 8000, (micro, block))
    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=bool(bf16)):
        out = OBJECTIVES[objective](model, ids, step_generator(0, 0), vocab_size=8000)
    out['loss'].backward(); opt.step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    weights = 4 * sum(p.numel() for p in model.parameters())
    bound = training_memory(model, micro, block, bool(bf16), attention, objective == 'clm')['total'] - weights
    return dict(arch=arch, preset=preset, block=block, micro=micro, bf16=bool(bf16), attention=attention, objective=objective,
                step_bytes=peak, bound_bytes=bound, ratio=peak / bound)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--configs', choices=list(CONFIGS), default='all')
    p.add_argument('--save', help='write the table as CSV')
    p.add_argument('--one', nargs=6, metavar=('ARCH', 'PRESET', 'BLOCK', 'MICRO', 'BF16', 'ATTENTION'))
    a = p.parse_args(argv)
    if a.one:
        arch, preset, block, micro, bf16, att = a.one
        print(json.dumps(one(arch, preset, int(block), int(micro), int(bf16), att))); return 0
    import pandas as pd
    rows = []
    for c in CONFIGS[a.configs]:           # a fresh process each: the peak resident memory is a process's high-water mark
        r = subprocess.run([sys.executable, __file__, '--one', *map(str, c)], capture_output=True, text=True, check=True)
        rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
        x = rows[-1]
        print(f"{x['arch']:>8} {x['preset']:>5} block {x['block']:>5} x {x['micro']:>2} {'bf16' if x['bf16'] else 'fp32'} {x['attention']:>5}: "
              f"step {x['step_bytes'] / 2**20:7.0f} MiB, bound {x['bound_bytes'] / 2**20:6.0f} MiB, ratio {x['ratio']:.2f}", flush=True)
    df = pd.DataFrame(rows)
    print(f"ratio of the step to the bound: {df.ratio.min():.2f}-{df.ratio.max():.2f} over {len(df)} configurations")
    if a.save: Path(a.save).parent.mkdir(parents=True, exist_ok=True); df.to_csv(a.save, index=False)
    return 0 if (df.ratio >= 1).all() else 1


if __name__ == '__main__':
    sys.exit(main())
