"""bf16 autocast against float32 in nl_embryo's own loop, on this machine: the step-time ratio per preset.

`precision='auto'` trains under bf16 autocast where the hardware computes bf16 products natively (CUDA, or a CPU with
AVX512-BF16 or AMX: `nl_embryo.core.native_bf16`). This bench is the measurement behind that default: the same loop,
model, data, batch and masking in both precisions, each measurement in a fresh process, the two alternating for
`--rounds` rounds (the method of `pretrain_throughput.py`, whose helpers it uses). What bf16 does to the loss is
measured by full runs (the pretrain chapter's precision section), not here.

    python bench/precision.py [--presets mini,tiny,small] [--steps 20] [--rounds 3] [--batch-size 32] [--block-size 64]
"""
import argparse, sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from pretrain_throughput import interleaved  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--presets', default='mini,tiny,small'); ap.add_argument('--steps', type=int, default=20)
    ap.add_argument('--rounds', type=int, default=3); ap.add_argument('--threads', type=int, default=torch.get_num_threads())
    ap.add_argument('--batch-size', type=int, default=32); ap.add_argument('--block-size', type=int, default=64)
    a = ap.parse_args()
    from nl_embryo.core import native_bf16
    print(f"cpu with native bf16: {native_bf16('cpu')}; {a.threads} threads, batch {a.batch_size} x {a.block_size}, "
          f"{a.steps} steps per measurement (median after the first 3), {a.rounds} interleaved rounds", flush=True)
    tokens = a.batch_size * a.block_size
    for preset in a.presets.split(','):
        common = dict(loop='ours', preset=preset, arch='bert', steps=a.steps, batch=a.batch_size, block=a.block_size, threads=a.threads)
        med, _ = interleaved(dict(fp32=dict(common, precision='fp32'), bf16=dict(common, precision='bf16')), a.rounds)
        print(f"bert {preset:6s} fp32 {tokens / med['fp32']:8,.0f} tok/s | bf16 {tokens / med['bf16']:8,.0f} tok/s | "
              f"bf16 speed-up {med['fp32'] / med['bf16']:.2f}x", flush=True)


if __name__ == '__main__':
    main()
