"""Pre-training throughput: nl_embryo's loop against the Hugging Face Trainer, measured in one run, interleaved.

Same model (the preset's architecture as its recipe builds it: pre-LN or post-LN, dropout), same packed data (the
`english` corpus), same batch and sequence length, same masking rate (15%: both loops do the same work), same
optimizer (AdamW) and precision (`--precision`, default `auto`: bf16 autocast for both where the hardware computes bf16
natively, as nl_embryo's loop does by default, fp32 elsewhere; `--precision fp32` or `bf16` forces one). The Trainer gets `DataCollatorForLanguageModeling` (full logits); nl_embryo computes
the MLM output layer only at the masked positions, with torch's fused AdamW and one host sync per step, and in bf16
on a CPU with the plain attention products (`training_attention`), where the Trainer's model keeps the `transformers`
default (`sdpa`).

Each measurement runs in a fresh process (so one loop's threads, caches or global settings cannot slow the other),
and the two loops alternate for `--rounds` rounds: ours, theirs, theirs, ours, ... . A measurement is the median step
time after the first 3 steps; a loop's figure is the median over its rounds. Then the objectives: MLM, ELECTRA and SCRIPT
steps of nl_embryo's loop (tiny preset), also interleaved in fresh processes, as step-time ratios to MLM next to the
ratio the analytic FLOPs counter predicts.

    python bench/pretrain_throughput.py [--presets tiny,small] [--steps 20] [--rounds 3] [--batch-size 32] [--block-size 128]

On a GPU the same script measures bf16 and prints the model FLOPs utilisation (MFU) of our loop.
"""
import argparse, json, statistics, subprocess, sys, tempfile, time
from pathlib import Path

import numpy as np
import torch


def our_step_time(preset, arch, steps, batch_size, block_size, out, compile=False, precision='fp32'):
    "Median seconds per optimizer step of nl_embryo's loop (after 3 warm-up steps), and the FLOPs per step it counts."
    from nl_embryo.pretrain import PretrainConfig, pretrain
    run = pretrain(PretrainConfig(out=str(out), arch=arch, preset=preset, corpus='english', steps=steps, batch_size=batch_size,
                                  block_size=block_size, checkpoints=f'0,{steps}', eval_batches=1, mask_prob=0.15,
                                  compile=compile, precision=precision), quiet=True)
    rows = [json.loads(l) for l in (run/'metrics.jsonl').read_text().splitlines()]
    times = [r['batch_size'] * block_size / r['tokens_per_s'] for r in rows if 'tokens_per_s' in r][3:]
    return statistics.median(times), rows[-1]['step_flops']


def trainer_step_time(preset, steps, batch_size, block_size, out, precision='fp32'):
    "Median seconds per optimizer step of the Hugging Face Trainer on the same model and data (after 3 warm-up steps)."
    from transformers import Trainer, TrainingArguments, DataCollatorForLanguageModeling, TrainerCallback
    from nl_embryo.corpora import load_corpus
    from nl_embryo.models import build_model
    from nl_embryo.pretrain import PretrainConfig
    corpus = load_corpus('english', block_size=block_size, quiet=True)
    tok = corpus.tokenizer()
    recipe = PretrainConfig(preset=preset).resolved()
    torch.manual_seed(0)
    model = build_model('bert', preset, vocab_size=len(tok), max_position=block_size, norm=recipe.norm, dropout=recipe.dropout)
    data = [{'input_ids': torch.from_numpy(np.asarray(b, dtype=np.int64))} for b in corpus.train[:steps * batch_size]]
    times = []
    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k): self.t = time.perf_counter()
        def on_step_end(self, *a, **k): times.append(time.perf_counter() - self.t)
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=batch_size, max_steps=steps, learning_rate=1e-3,
                             warmup_steps=max(1, steps // 10), save_strategy='no', report_to='none', logging_steps=10_000,
                             dataloader_num_workers=0, use_cpu=not torch.cuda.is_available(), bf16=precision == 'bf16',
                             disable_tqdm=True, optim='adamw_torch', max_grad_norm=1.0)
    collator = DataCollatorForLanguageModeling(tok, mlm=True, mlm_probability=0.15)
    Trainer(model=model, args=args, train_dataset=data, data_collator=collator, callbacks=[Clock()]).train()
    return statistics.median(times[3:]), None


def child(spec):
    "Run one measurement in this (fresh) process; print its result as JSON."
    torch.set_num_threads(spec['threads'])
    with tempfile.TemporaryDirectory() as d:
        if spec['loop'] == 'trainer': t, flops = trainer_step_time(spec['preset'], spec['steps'], spec['batch'], spec['block'], Path(d), spec['precision'])
        else: t, flops = our_step_time(spec['preset'], spec['arch'], spec['steps'], spec['batch'], spec['block'], Path(d), spec.get('compile', False), spec['precision'])
    print(json.dumps(dict(seconds=t, flops=flops)))


def measure(spec) -> dict:
    "One measurement in a fresh Python process."
    r = subprocess.run([sys.executable, __file__, '--child', json.dumps(spec)], capture_output=True, text=True)
    if r.returncode: raise SystemExit(f"measurement {spec} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def interleaved(specs: dict, rounds: int) -> dict:
    "Median step time per named spec, the specs run in alternating order for `rounds` rounds."
    times = {k: [] for k in specs}
    names = list(specs)
    for i in range(rounds):
        for k in (names if i % 2 == 0 else names[::-1]):
            times[k].append(measure(specs[k])['seconds'])
    return {k: statistics.median(v) for k, v in times.items()}, times


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--presets', default='tiny,small'); ap.add_argument('--steps', type=int, default=20)
    ap.add_argument('--rounds', type=int, default=3); ap.add_argument('--threads', type=int, default=torch.get_num_threads())
    ap.add_argument('--batch-size', type=int, default=32); ap.add_argument('--block-size', type=int, default=128)
    ap.add_argument('--objectives', default='electra,script', help='also time these against MLM (tiny preset); empty: skip')
    ap.add_argument('--compile', action='store_true', help='also time our loop with torch.compile')
    ap.add_argument('--precision', choices=('auto', 'fp32', 'bf16'), default='auto',
                    help="both loops train in this precision (bf16: autocast; on a CPU only where it has AVX512-BF16 or AMX); "
                         "auto: the one nl_embryo's loop picks by default, bf16 where the hardware has it, else fp32")
    ap.add_argument('--child', help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child: return child(json.loads(a.child))
    dev = 'cuda' if torch.cuda.is_available() else 'cpu'
    if a.precision == 'auto':
        from nl_embryo.core import native_bf16
        a.precision = 'bf16' if native_bf16(dev) else 'fp32'
    print(f"device {dev} ({torch.cuda.get_device_name() if dev == 'cuda' else f'{a.threads} threads'}), batch {a.batch_size} x "
          f"{a.block_size} tokens, {a.precision} for both loops, {a.steps} steps per measurement (median after the first 3), {a.rounds} interleaved rounds", flush=True)
    common = dict(steps=a.steps, batch=a.batch_size, block=a.block_size, threads=a.threads, precision=a.precision)
    tokens = a.batch_size * a.block_size
    for preset in a.presets.split(','):
        specs = dict(ours=dict(loop='ours', preset=preset, arch='bert', **common), trainer=dict(loop='trainer', preset=preset, **common))
        if a.compile: specs['ours+compile'] = dict(specs['ours'], compile=True)
        med, all_times = interleaved(specs, a.rounds)
        line = (f"bert {preset:6s} ours {tokens / med['ours']:9,.0f} tok/s | HF Trainer {tokens / med['trainer']:9,.0f} tok/s | "
                f"ratio {med['trainer'] / med['ours']:5.2f}x")
        if 'ours+compile' in med: line += f" | ours + torch.compile {tokens / med['ours+compile']:9,.0f} tok/s ({med['trainer'] / med['ours+compile']:.2f}x)"
        if dev == 'cuda':
            flops = measure(specs['ours'])['flops']
            peak = 989e12 if 'H100' in torch.cuda.get_device_name() else 790e12 if 'H200' in torch.cuda.get_device_name() else None
            if peak: line += f" | MFU {flops / med['ours'] / peak:.1%}"
        print(line, f"  (rounds, s/step: {json.dumps({k: [round(x, 3) for x in v] for k, v in all_times.items()})})", flush=True)
    if a.objectives:
        from nl_embryo.models import build_model, flops_per_token
        specs = {arch: dict(loop='ours', preset='tiny', arch=arch, **common) for arch in ['bert', *a.objectives.split(',')]}
        med, _ = interleaved(specs, a.rounds)
        base_flops = flops_per_token(build_model('bert', 'tiny', device='meta'), a.block_size)['total']
        for arch in a.objectives.split(','):
            counted = flops_per_token(build_model(arch, 'tiny', device='meta'), a.block_size)['total'] / base_flops
            print(f"{arch:8s} tiny step time relative to MLM: {med[arch] / med['bert']:4.2f}x (FLOPs counter: {counted:.2f}x)", flush=True)


if __name__ == '__main__':
    main()
