"""bf16 autocast against float32 in nl_embryo's own loop, on this machine: the step-time ratio per preset.

`precision='auto'` trains under bf16 autocast where the hardware computes bf16 products natively (CUDA, or a CPU with
AVX512-BF16 or AMX: `nl_embryo.core.native_bf16`). This bench is the measurement behind that default: the same loop,
model, data, batch and masking in both precisions, each in its own worker process, timed in interleaved segments with
the harness of `interleave.py` (25th percentile of the step times over segments where other processes left the loops'
cores free; a ratio only when the per-round ratios agree). What bf16 does to the loss is measured by full runs (the
pretrain chapter's precision section), not here.

`--weights` asks what a bf16 copy of the weights would gain over autocast (the loop keeps float32 weights: autocast casts
each to bf16 in every forward, and each weight's gradient comes back through that cast): two minimal loops of one step
each (nl_embryo's MLM objective; the attention the loop uses in bf16, eager on a CPU and `sdpa` on a GPU; gradient
clipping at 1.0, fused AdamW), on the same model, data and masks. `autocast` keeps float32 weights under bf16 autocast,
as the loop does; `bf16-weights` runs a bf16 model without autocast and keeps float32 master weights for the optimizer
(the gradients cast up, the step taken in float32, the weights copied back down), as mixed-precision trainers without
autocast do. Both train the same model on the same batches; the numerics differ (norms, softmax and the residual stream
in bf16), which is why this is a measurement and not an option of the loop. `--profile-steps N` then profiles N steps of
each (in this process, not interleaved). On a GPU both run there, each step ending in a sync. `step_traffic.py
--bf16-weights` counts the bytes the two move.

    python bench/precision.py [--presets mini,tiny,small] [--rounds 6] [--threads auto] [--batch-size 32] [--block-size 64]
    python bench/precision.py --weights --presets small --block-size 128 [--profile-steps 4] [--save weights.json]
"""
import argparse, json, sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from interleave import interleave, ratio, describe, serve  # noqa: E402


def weights_step(spec):
    "One training step per call with float32 weights under bf16 autocast, or with bf16 weights and float32 master weights; and its FLOPs."
    import torch
    from nl_embryo.corpora import load_corpus
    from nl_embryo.models import build_model, flops_per_token
    from nl_embryo.objectives import mlm_objective, step_generator
    from nl_embryo.pretrain import PretrainConfig
    corpus = load_corpus('english', block_size=spec['block'], quiet=True)
    recipe = PretrainConfig(preset=spec['preset']).resolved()
    dev = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    torch.manual_seed(0)
    model = build_model('bert', spec['preset'], vocab_size=len(corpus.tokenizer()), max_position=spec['block'], norm=recipe.norm, dropout=recipe.dropout).to(dev)
    model.set_attn_implementation(spec.get('attention') or ('eager' if dev.type == 'cpu' else 'sdpa')); model.train()   # the loop's choice in bf16
    params = list(model.parameters())
    pure = spec['weights'] == 'bf16-weights'
    master = [p.detach().float().clone().requires_grad_() for p in params] if pure else params
    if pure: model.to(torch.bfloat16)
    opt = torch.optim.AdamW(master, lr=1e-4, eps=1e-6, fused=True)
    batches = torch.as_tensor(corpus.train[:spec['batch'] * 8].astype('int64')).view(8, spec['batch'], -1).to(dev)
    V = model.config.vocab_size
    state = dict(step=0)
    def unit():
        i = state['step']; state['step'] += 1
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=not pure):
            out = mlm_objective(model, batches[i % 8], step_generator(0, i, dev), V)
        out['loss'].backward()
        if pure:
            for p, m in zip(params, master): m.grad = p.grad.float(); p.grad = None
        torch.nn.utils.clip_grad_norm_(master, 1.0)
        opt.step(); opt.zero_grad(set_to_none=True)
        if pure:
            with torch.no_grad(): torch._foreach_copy_(params, master)
        if dev.type == 'cuda': torch.cuda.synchronize()                                    # the step's kernels, not only their launch
    f = flops_per_token(model, spec['block'], masked_fraction=0.15)['total']
    return unit, 3 * f * spec['batch'] * spec['block']


def weights_loop(spec):
    unit, flops = weights_step(spec)
    serve(unit, warmup=2, flops=flops)


def profile_weights(spec, steps: int) -> dict:
    "Each operator's own CPU time per step, grouped as `profile_step.py` groups them, over `steps` steps after 2 warm-up steps."
    import torch
    from torch.profiler import profile, ProfilerActivity
    from profile_step import group_of
    from nl_embryo.corpora import load_corpus
    unit, _ = weights_step(spec)
    vocab = len(load_corpus('english', block_size=spec['block'], quiet=True).tokenizer())
    unit(); unit()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(steps): unit()
    out = {}
    for e in prof.key_averages(group_by_input_shape=True):
        g = group_of(e.key, e.input_shapes, vocab); out[g] = out.get(g, 0.0) + e.self_cpu_time_total / 1e3 / steps
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--presets', default='mini,tiny,small'); ap.add_argument('--rounds', type=int, default=6)
    ap.add_argument('--threads', default='auto'); ap.add_argument('--max-disagreement', type=float, default=1.5)
    ap.add_argument('--batch-size', type=int, default=32); ap.add_argument('--block-size', type=int, default=64)
    ap.add_argument('--weights', action='store_true', help='autocast against bf16 weights with float32 master weights (see above)')
    ap.add_argument('--save', help='with --weights: write the timings and ratios as JSON to this file')
    ap.add_argument('--profile-steps', type=int, default=0, help='with --weights: then profile this many steps of each loop (milliseconds per step by operator group)')
    ap.add_argument('--worker', help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker: return weights_loop(json.loads(a.worker))
    if a.weights: return compare_weights(a)
    from nl_embryo.core import native_bf16
    print(f"cpu with native bf16: {native_bf16('cpu')}; batch {a.batch_size} x {a.block_size}, {a.rounds} interleaved rounds", flush=True)
    tokens = a.batch_size * a.block_size
    script = str(Path(__file__).resolve().parent/'pretrain_throughput.py')
    for preset in a.presets.split(','):
        spec = dict(loop='ours', preset=preset, arch='bert', batch=a.batch_size, block=a.block_size)
        t = interleave({p: [sys.executable, script, '--worker', json.dumps(dict(spec, precision=p))] for p in ('fp32', 'bf16')},
                       rounds=a.rounds, threads=a.threads)
        for p in ('fp32', 'bf16'): print(f"  {describe(t, p)}")
        r, line = ratio(t, 'fp32', 'bf16', max_disagreement=a.max_disagreement)
        tok = lambda p: f"{tokens / t.stats(p)['q25']:8,.0f} tok/s" if t.stats(p) else 'n/a'
        print(f"bert {preset:6s} fp32 {tok('fp32')} | bf16 {tok('bf16')} | " + (f"bf16 speed-up {r:.2f}x ({line})" if r else line), flush=True)


def compare_weights(a):
    import datetime, platform
    import torch
    arms = ('autocast', 'bf16-weights')
    print(f"bf16 weights against autocast: batch {a.batch_size} x {a.block_size}, {a.rounds} interleaved rounds", flush=True)
    runs = []
    for preset in a.presets.split(','):
        spec = dict(preset=preset, batch=a.batch_size, block=a.block_size)
        t = interleave({w: [sys.executable, __file__, '--worker', json.dumps(dict(spec, weights=w))] for w in arms},
                       rounds=a.rounds, threads=a.threads)
        for w in arms: print(f"  {describe(t, w)}")
        r, line = ratio(t, 'autocast', 'bf16-weights', max_disagreement=a.max_disagreement)
        flops = next(s.extra['flops'] for s in t.segments if 'flops' in s.extra)
        rate = {w: flops / t.stats(w)['q25'] / 1e12 if t.stats(w) else None for w in arms}
        print(f"bert {preset:6s} model TFLOP/s: autocast {rate['autocast'] or float('nan'):.3f} | bf16 weights {rate['bf16-weights'] or float('nan'):.3f} | "
              + (f"bf16 weights at {r:.2f}x the speed of autocast ({line})" if r else line), flush=True)
        prof = {}
        if a.profile_steps:
            torch.set_num_threads(t.threads)
            prof = {w: profile_weights(dict(spec, weights=w), a.profile_steps) for w in arms}
            groups = sorted(prof['autocast'], key=lambda g: -prof['autocast'][g])
            print(f"  profile ({a.profile_steps} steps each, ms per step, operators' own CPU time):")
            for g in groups: print(f"    {g:42s} {prof['autocast'][g]:8.1f} {prof['bf16-weights'].get(g, 0.0):8.1f}")
            print(f"    {'total':42s} {sum(prof['autocast'].values()):8.1f} {sum(prof['bf16-weights'].values()):8.1f}")
        runs.append(dict(preset=preset, ratio=r, line=line, tflops=rate, stats={w: t.stats(w) for w in arms}, profile=prof,
                         rounds=[dict(round=s.round, loop=s.loop, clean=s.clean, times=s.times) for s in t.segments]))
    if a.save:
        Path(a.save).write_text(json.dumps(dict(date=datetime.date.today().isoformat(), machine=platform.processor() or platform.machine(),
                                                torch=torch.__version__, threads=t.threads, batch=a.batch_size, block=a.block_size, runs=runs), indent=1))


if __name__ == '__main__':
    main()
