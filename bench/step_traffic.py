"""Memory traffic and FLOPs of one training step, operator by operator, and the least time they allow on a GPU.

Why a step of eager kernels runs below the matmul peak, counted rather than guessed: under a `TorchDispatchMode`,
every operator of one step of nl_embryo's loop (`pretrain`, `english` corpus, the preset's recipe at 15% masking,
bf16 autocast, and the fused `sdpa` attention the loop trains with on a GPU) is recorded with
- its FLOPs: torch's FLOP-counter formulas for the products and the fused attention (forward and backward);
- the bytes it moves: each distinct tensor it reads once, each tensor it writes once (an in-place operator's
  target is read and written; a view moves nothing; a broadcast input counts its storage, not its expanded size).

The step is counted on this machine's CPU at two small batch sizes (`--count-batches`). Each operator's FLOPs and bytes
are affine in the batch (the weights and the optimizer's state are fixed, the activations grow with it), so the
operators, matched one to one between the two counts, are extrapolated to `--batch-size`. Each operator then takes at
least max(FLOPs / `--peak`, bytes / `--bandwidth`): their sum is the least time these kernels, run one after another as
eager PyTorch runs them, can take on a device with that matmul rate and memory bandwidth. It is printed by group (as
`profile_step.py` groups the profiler's table) next to a measured step time (`--measured`: seconds, or the JSON that
`pretrain_throughput.py --save` wrote, whose bf16 step time of the preset and bf16 matmul peak are then used), with the
model FLOPs utilisation (MFU) that the bound allows against `--datasheet-peak`.

What the count leaves out, and which way it errs: the CPU's dispatch stands in for the GPU's (the same operators
under bf16 autocast; layer norms see the float32 residual stream on both, since the residual additions promote);
kernels are taken to overlap with nothing (the bound is for unfused, serial kernels) and caches to keep nothing between
kernels (at batch 256 x 128 most activations are 50-100 MB, beyond an H100's 50 MB L2); the data-sheet bandwidth and
the best measured product rate are limits that kernels do not quite reach, so on that count the bound is optimistic.

    python bench/step_traffic.py [--preset base] [--batch-size 256] [--block-size 128] [--count-batches 2,4]
                                 [--peak 716.8e12] [--bandwidth 3.35e12] [--datasheet-peak 989e12]
                                 [--measured SECONDS|mfu.json] [--save traffic.csv]
"""
import argparse, json, sys, tempfile, warnings
from pathlib import Path

import pandas as pd
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

sys.path.insert(0, str(Path(__file__).parent))
from profile_step import group_of

aten = torch.ops.aten
FLOPS_AS = {   # CPU operators counted with the formula of the GPU operator they stand for (same leading arguments)
    'aten._scaled_dot_product_flash_attention_for_cpu': aten._scaled_dot_product_flash_attention,
    'aten._scaled_dot_product_flash_attention_for_cpu_backward': aten._scaled_dot_product_flash_attention_backward,
}
H100_BANDWIDTH = 3.35e12   # bytes/s: the H100 SXM's HBM3 by the maker's data sheet
H100_PEAK = 989e12         # FLOP/s: its dense bf16 peak by the same data sheet


def tensor_bytes(t: torch.Tensor) -> int:
    "Bytes a kernel touches for `t`: its elements, or its storage when that is smaller (a broadcast or expanded view)."
    n = t.numel() * t.element_size()
    try: return min(n, t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError): return n


def _key(t): return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


class Traffic(TorchDispatchMode):
    "Record each operator run under it as a dict: `op`, `shapes` (of its tensor inputs), `flops`, `bytes`."
    def __init__(self):
        super().__init__(); self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        schema, name = func._schema, str(func.overloadpacket)
        rets = [r.alias_info for r in schema.returns]
        if rets and all(a is not None and not a.is_write for a in rets):           # a view: no data moves
            self.ops.append(dict(op=name, shapes=[], flops=0, bytes=0)); return out
        ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        written = [v for a, v in zip(schema.arguments, args) if a.alias_info is not None and a.alias_info.is_write]
        written = [t for t in tree_flatten(written)[0] if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        seen_in = {}
        for t in ins: seen_in.setdefault(_key(t), t)
        if func.overloadpacket is aten.copy_: seen_in.pop(_key(args[0]), None)   # copy_ writes its target without reading it
        seen_out = {}
        for t in written + [t for t in outs if _key(t) not in {_key(w) for w in written}]: seen_out.setdefault(_key(t), t)
        moved = sum(map(tensor_bytes, seen_in.values())) + sum(map(tensor_bytes, seen_out.values()))
        f = flop_registry.get(func.overloadpacket) or flop_registry.get(FLOPS_AS.get(name))
        flops = int(f(*args, **kwargs, out_val=out)) if f is not None else 0
        self.ops.append(dict(op=name, shapes=[list(t.shape) for t in ins], flops=flops, bytes=moved))
        return out


def count_step(preset: str, batch: int, block: int, precision: str = 'bf16') -> list[dict]:
    "The operators of the third optimizer step of nl_embryo's loop (`Traffic` rows), with the `sdpa` attention a GPU gets."
    import nl_embryo.pretrain as P
    from nl_embryo.pretrain import PretrainConfig, pretrain
    mode, state, chosen = Traffic(), {}, P.training_attention
    def hook(row):
        if row['step'] == 3: mode.__exit__(None, None, None); state['done'] = True
        if row['step'] == 2: mode.__enter__()
    P.training_attention = lambda *a, **k: 'sdpa'     # the attention the loop trains with on a GPU (on a CPU in bf16 it takes eager)
    try:
        with tempfile.TemporaryDirectory() as d, warnings.catch_warnings():
            warnings.filterwarnings('ignore', message='.*ended on the unigram plateau')   # 5 steps: it does, as expected
            pretrain(PretrainConfig(out=str(Path(d)/'run'), preset=preset, corpus='english', steps=5, batch_size=batch, block_size=block,
                                    checkpoints='0', eval_batches=1, mask_prob=0.15, precision=precision), quiet=True, on_step=hook)
    finally: P.training_attention = chosen
    if not state.get('done'): raise SystemExit("the counted step did not run")
    return mode.ops


def count_weights_step(preset: str, batch: int, block: int, weights: str) -> list[dict]:
    "The operators of one step of `precision.py`'s minimal loop (`weights`: 'autocast' or 'bf16-weights'), with `sdpa` attention."
    from precision import weights_step
    unit, _ = weights_step(dict(preset=preset, batch=batch, block=block, weights=weights, attention='sdpa'))
    unit(); unit()
    with Traffic() as mode: unit()
    return mode.ops


def extrapolate(a: list[dict], b: list[dict], ba: int, bb: int, to: int) -> pd.DataFrame:
    "Operators counted at batches `ba` and `bb`, matched in order, each one's FLOPs and bytes carried linearly to batch `to`."
    if [r['op'] for r in a] != [r['op'] for r in b]:
        raise SystemExit(f"the step at batch {ba} and at batch {bb} ran different operators ({len(a)} against {len(b)}): cannot match them")
    rows = []
    for x, y in zip(a, b):
        k = (to - ba) / (bb - ba)
        rows.append(dict(op=x['op'], shapes=y['shapes'], flops=max(0.0, x['flops'] + k * (y['flops'] - x['flops'])),
                         bytes=max(0.0, x['bytes'] + k * (y['bytes'] - x['bytes']))))
    return pd.DataFrame(rows)


def bound(ops: pd.DataFrame, peak: float, bandwidth: float, vocab: int) -> pd.DataFrame:
    "Per group and operator: calls, FLOPs, bytes and the least time, each call taking max(FLOPs / `peak`, bytes / `bandwidth`)."
    d = ops.assign(group=[group_of(o.replace('aten.', 'aten::', 1), s, vocab) for o, s in zip(ops['op'], ops['shapes'])],
                   t_flops=ops['flops'] / peak, t_bytes=ops['bytes'] / bandwidth)
    d['least_s'] = d[['t_flops', 't_bytes']].max(axis=1)
    d['memory_bound_s'] = d['least_s'].where(d['t_bytes'] > d['t_flops'], 0.0)
    g = d.groupby(['group', 'op']).agg(n_ops=('op', 'size'), flops=('flops', 'sum'), bytes=('bytes', 'sum'),
                                       least_s=('least_s', 'sum'), memory_bound_s=('memory_bound_s', 'sum'))
    return g.sort_values('least_s', ascending=False).reset_index()


def by_group(t: pd.DataFrame) -> pd.DataFrame:
    "`bound`'s table summed per group, in TFLOP, GB and milliseconds."
    g = t.groupby('group')[['n_ops', 'flops', 'bytes', 'least_s', 'memory_bound_s']].sum().sort_values('least_s', ascending=False)
    return pd.DataFrame(dict(n_ops=g['n_ops'], tflop=g['flops'] / 1e12, gb=g['bytes'] / 1e9, least_ms=g['least_s'] * 1e3,
                             memory_bound_ms=g['memory_bound_s'] * 1e3)).reset_index()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--preset', default='base'); ap.add_argument('--batch-size', type=int, default=256)
    ap.add_argument('--block-size', type=int, default=128); ap.add_argument('--count-batches', default='2,4')
    ap.add_argument('--peak', type=float, default=None, help='matmul FLOP/s (default: the measured JSON\'s bf16 peak, else 716.8e12)')
    ap.add_argument('--bandwidth', type=float, default=H100_BANDWIDTH, help='memory bytes/s (default: the H100 SXM data sheet)')
    ap.add_argument('--datasheet-peak', type=float, default=H100_PEAK, help='the dense bf16 FLOP/s the MFU is a fraction of (default: the H100 data sheet)')
    ap.add_argument('--measured', help='a measured step time in seconds, or a pretrain_throughput.py --save JSON')
    ap.add_argument('--bf16-weights', action='store_true', help="also count precision.py's minimal loop with float32 weights under autocast and with bf16 weights (float32 master weights): what a bf16 residual stream would save")
    ap.add_argument('--save', help='write the table per group and operator (and the totals, as a JSON beside it) to this CSV file')
    a = ap.parse_args()
    from nl_embryo.models import build_model, flops_per_token
    measured, peak, source = None, a.peak, None
    if a.measured:
        try: measured = float(a.measured)
        except ValueError:
            try: j = json.loads(Path(a.measured).read_text())
            except (OSError, ValueError) as e: raise SystemExit(f"--measured {a.measured}: neither seconds nor a readable JSON ({e}); pass e.g. 0.0726 or the file pretrain_throughput.py --save wrote")
            source = j.get('machine')
            r = next((c for c in j.get('comparisons', []) if c['preset'] == a.preset and c['precision'] == 'bf16'), None)
            if r is None: raise SystemExit(f"--measured {a.measured} has no {a.preset} bf16 comparison: measure it with pretrain_throughput.py --presets {a.preset} --save, or pass seconds")
            measured = r['ours']['q25']
            peak = peak or max((v['tflops'] for k, v in j.get('roofline', {}).items() if 'bf16' in k), default=0) * 1e12 or None
    peak = peak or 716.8e12
    try: ba, bb = map(int, a.count_batches.split(','))
    except ValueError: raise SystemExit(f"--count-batches {a.count_batches!r}: give two batch sizes, e.g. 2,4")
    if not 0 < ba < bb: raise SystemExit(f"--count-batches {a.count_batches}: give two different batch sizes above 0, the smaller first, e.g. 2,4")
    ops = extrapolate(count_step(a.preset, ba, a.block_size), count_step(a.preset, bb, a.block_size), ba, bb, a.batch_size)
    vocab = build_model('bert', a.preset, device='meta').config.vocab_size
    t = bound(ops, peak, a.bandwidth, vocab); g = by_group(t)
    model_flops = 3 * flops_per_token(build_model('bert', a.preset, device='meta'), a.block_size, masked_fraction=0.15)['total'] * a.batch_size * a.block_size
    least = g['least_ms'].sum() / 1e3
    print(f"{a.preset} bf16, one step at batch {a.batch_size} x {a.block_size} (counted at batches {ba} and {bb}, extrapolated): "
          f"{len(ops):,} operators, {ops['flops'].sum() / 1e12:.2f} TFLOP, {ops['bytes'].sum() / 1e9:.1f} GB moved")
    print(f"least time per operator = max(FLOPs / {peak / 1e12:.1f} TFLOP/s, bytes / {a.bandwidth / 1e12:.2f} TB/s), summed by group:")
    print(g.to_string(index=False, formatters=dict(tflop='{:.2f}'.format, gb='{:.1f}'.format, least_ms='{:.1f}'.format, memory_bound_ms='{:.1f}'.format)))
    mem = t[t['memory_bound_s'] > 0].groupby('op')['memory_bound_s'].sum().sort_values(ascending=False)
    print("largest memory-bound operators:", ', '.join(f"{o} {v * 1e3:.1f} ms" for o, v in mem.head(6).items()))
    print(f"=> least step time {least * 1e3:.1f} ms, of which memory-bound operators {g['memory_bound_ms'].sum():.1f} ms; "
          f"model FLOPs (counter, forward x 3) {model_flops / 1e12:.2f} TFLOP: at most {model_flops / least / 1e12:.0f} TFLOP/s, "
          f"an MFU of {model_flops / least / a.datasheet_peak:.0%} of the {a.datasheet_peak / 1e12:.0f} TFLOP/s data-sheet peak")
    totals = dict(preset=a.preset, batch=a.batch_size, block=a.block_size, count_batches=[ba, bb], peak=peak, bandwidth=a.bandwidth,
                  datasheet_peak=a.datasheet_peak, n_ops=len(ops), tflop=ops['flops'].sum() / 1e12, gb=ops['bytes'].sum() / 1e9, least_s=least,
                  memory_bound_s=g['memory_bound_ms'].sum() / 1e3, model_flops=model_flops, measured_s=measured, measured_on=source,
                  torch=torch.__version__)
    if measured:
        print(f"=> measured step {measured * 1e3:.1f} ms{f' ({source})' if source else ''}: the bound explains {least / measured:.0%} of it")
    if a.bf16_weights:
        totals['minimal'] = {}
        for w in ('autocast', 'bf16-weights'):
            m = extrapolate(count_weights_step(a.preset, ba, a.block_size, w), count_weights_step(a.preset, bb, a.block_size, w), ba, bb, a.batch_size)
            mt = bound(m, peak, a.bandwidth, vocab); s = mt['least_s'].sum()
            totals['minimal'][w] = dict(n_ops=len(m), tflop=m['flops'].sum() / 1e12, gb=m['bytes'].sum() / 1e9, least_s=s,
                                        memory_bound_s=mt['memory_bound_s'].sum(), by_group=by_group(mt).set_index('group')['least_ms'].round(3).to_dict())
            print(f"precision.py's minimal step, {w}: {len(m):,} operators, {m['bytes'].sum() / 1e9:.1f} GB moved, least step time {s * 1e3:.1f} ms "
                  f"(memory-bound {mt['memory_bound_s'].sum() * 1e3:.1f} ms): at most {model_flops / s / 1e12:.0f} TFLOP/s, an MFU of {model_flops / s / a.datasheet_peak:.0%}")
    if a.save:
        t.to_csv(a.save, index=False); Path(a.save).with_suffix('.json').write_text(json.dumps(totals, indent=1))


if __name__ == '__main__':
    main()
