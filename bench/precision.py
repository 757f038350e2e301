"""bf16 autocast against float32 in nl_embryo's own loop, on this machine: the step-time ratio per preset.

`precision='auto'` trains under bf16 autocast where the hardware computes bf16 products natively (CUDA, or a CPU with
AVX512-BF16 or AMX: `nl_embryo.core.native_bf16`). This bench is the measurement behind that default: the same loop,
model, data, batch and masking in both precisions, each in its own worker process, timed in interleaved segments with
the harness of `interleave.py` (25th percentile of the step times over segments where other processes left the loops'
cores free; a ratio only when the per-round ratios agree). What bf16 does to the loss is measured by full runs (the
pretrain chapter's precision section), not here.

    python bench/precision.py [--presets mini,tiny,small] [--rounds 6] [--threads auto] [--batch-size 32] [--block-size 64]
"""
import argparse, json, sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from interleave import interleave, ratio, describe  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--presets', default='mini,tiny,small'); ap.add_argument('--rounds', type=int, default=6)
    ap.add_argument('--threads', default='auto'); ap.add_argument('--max-disagreement', type=float, default=1.5)
    ap.add_argument('--batch-size', type=int, default=32); ap.add_argument('--block-size', type=int, default=64)
    a = ap.parse_args()
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


if __name__ == '__main__':
    main()
