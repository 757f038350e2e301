"""Pre-training throughput: nl_embryo's loop against the Hugging Face Trainer, and against the machine's own matmul peak.

Same model (the preset's architecture as its recipe builds it: pre-LN or post-LN, dropout), same packed data (the
`english` corpus), same batch and sequence length, same masking rate (15%: both loops do the same work), same
optimizer (AdamW) and precision (each of `--precisions`: `bf16` is autocast for both loops, and is measured only where
the hardware computes bf16 natively; `fp32`). The Trainer gets `DataCollatorForLanguageModeling` (full logits) and the
`transformers` default attention (`sdpa`); nl_embryo computes the MLM output layer only at the masked positions, with
torch's fused AdamW, and its host waits for the device twice a step: mid-forward, where the masked positions are
gathered, and at the end, where the step's statistics are read in one transfer.

How it is timed (`bench/interleave.py`): each loop runs in its own long-lived worker process, warmed up once, and the
loops take turns in short segments (A B B A ...) for `--rounds` rounds. Around every segment the machine's CPU counters
say how much CPU other processes took; only segments where they left the loops' cores free count. A loop's figure is
the 25th percentile of its step times over those segments (min, median and max are printed beside it, with its CPU use);
a ratio is printed only when the per-round ratios agree within `--max-disagreement`, else the line says why. With
`--threads auto` (default) the workers get the cores other processes leave free (a neighbour keeping one of two cores
busy gives a one-thread measurement, stated as such).

Then three more measurements, timed the same way:
- **roofline**: torch's own dense matmul (`torch.mm`, fp32 and bf16) at the shapes the presets' feed-forward layers
  use (batch x block tokens by hidden by intermediate) and at a large square size; the loop's model FLOP/s (the FLOPs
  counter's training FLOPs per step, forward x 3, over the step time) as a fraction of the largest measured matmul rate
  of each precision, for `--roofline-presets` (default tiny, small, base);
- **objectives**: MLM, ELECTRA and SCRIPT steps of nl_embryo's loop (tiny preset) as step-time ratios to MLM, next to
  the ratio of their training FLOPs by the counter (SCRIPT: two forwards and one backward).

    python bench/pretrain_throughput.py [--presets tiny,small] [--precisions bf16,fp32] [--rounds 6] [--threads auto]
                                        [--batch-size 32] [--block-size 128] [--objectives electra,script]
                                        [--roofline-presets tiny,small,base] [--compile]

On a GPU the same script times bf16 and prints the model FLOPs utilisation (MFU) against the GPU's dense bf16 peak.
"""
import argparse, datetime, json, os, platform, sys, tempfile, time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from interleave import Channel, serve, interleave, ratio, describe, worker_threads

GPU_PEAK_BF16 = {'H100': 989e12, 'H200': 989e12, 'A100': 312e12}   # dense bf16 FLOP/s by the makers' data sheets (SXM)


# ---------------------------------------------------------------- workers
def our_loop(spec):
    "nl_embryo's loop, reporting each step's time to the parent (set up once; runs until told to stop)."
    from nl_embryo.pretrain import PretrainConfig, pretrain
    ch = Channel(warmup=3)
    block = spec['block']
    hook = lambda row: ch.step(row['batch_size'] * block / row['tokens_per_s'], flops=row['step_flops'])
    with tempfile.TemporaryDirectory() as d:
        pretrain(PretrainConfig(out=str(Path(d)/'run'), arch=spec['arch'], preset=spec['preset'], corpus='english', steps=100_000,
                                batch_size=spec['batch'], block_size=block, checkpoints='0', eval_batches=1, mask_prob=0.15,
                                precision=spec['precision'], compile=spec.get('compile', False)), quiet=True, on_step=hook)


def trainer_loop(spec):
    "The Hugging Face Trainer on the same model and data, reporting each step's time to the parent."
    from transformers import Trainer, TrainingArguments, DataCollatorForLanguageModeling, TrainerCallback
    from nl_embryo.corpora import load_corpus
    from nl_embryo.models import build_model
    from nl_embryo.pretrain import PretrainConfig
    ch = Channel(warmup=3)
    corpus = load_corpus('english', block_size=spec['block'], quiet=True)
    tok = corpus.tokenizer()
    recipe = PretrainConfig(preset=spec['preset']).resolved()
    torch.manual_seed(0)
    model = build_model('bert', spec['preset'], vocab_size=len(tok), max_position=spec['block'], norm=recipe.norm, dropout=recipe.dropout)
    data = [{'input_ids': torch.from_numpy(np.asarray(b, dtype=np.int64))} for b in corpus.train]
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k): sync(); self.t = time.perf_counter()
        def on_step_end(self, *a, **k): sync(); ch.step(time.perf_counter() - self.t)   # the step's kernels, not only their launch
    with tempfile.TemporaryDirectory() as d:
        args = TrainingArguments(output_dir=d, per_device_train_batch_size=spec['batch'], max_steps=100_000, learning_rate=1e-3,
                                 warmup_steps=10, save_strategy='no', report_to='none', logging_steps=10**9,
                                 dataloader_num_workers=0, use_cpu=not torch.cuda.is_available(), bf16=spec['precision'] == 'bf16',
                                 disable_tqdm=True, optim='adamw_torch', max_grad_norm=1.0)
        collator = DataCollatorForLanguageModeling(tok, mlm=True, mlm_probability=0.15)
        Trainer(model=model, args=args, train_dataset=data, data_collator=collator, callbacks=[Clock()]).train()


def matmul(spec):
    "torch.mm of an (m x k) by a (k x n) matrix in `dtype`, one product per step."
    dev = 'cuda' if torch.cuda.is_available() else 'cpu'
    dtype = dict(fp32=torch.float32, bf16=torch.bfloat16)[spec['dtype']]
    m, k, n = spec['shape']
    a, b = torch.randn(m, k, device=dev).to(dtype), torch.randn(k, n, device=dev).to(dtype)
    sync = torch.cuda.synchronize if dev == 'cuda' else (lambda: None)
    def unit():
        for _ in range(spec.get('repeat', 1)): torch.mm(a, b)
        sync()
    serve(unit, warmup=2, flops=2.0 * m * k * n * spec.get('repeat', 1))


WORKERS = dict(ours=our_loop, trainer=trainer_loop, matmul=matmul)


# ---------------------------------------------------------------- parent
def argv(spec): return [sys.executable, __file__, '--worker', json.dumps(spec)]


def flops_of(timing, loop):
    "FLOPs per step a worker reported (the FLOPs counter's, or the product's)."
    return next(s.extra['flops'] for s in timing.segments if s.loop == loop and 'flops' in s.extra)


def machine_line(dev, threads_line):
    if dev == 'cuda': return f"device cuda ({torch.cuda.get_device_name()}), torch {torch.__version__}"
    cpu = next((l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') if l.startswith('model name')), platform.processor())
    return f"device cpu ({cpu}, {os.cpu_count()} cores), torch {torch.__version__}; workers on {threads_line}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--presets', default='tiny,small')
    ap.add_argument('--precisions', default='bf16,fp32', help="comma-separated; bf16 is skipped where the hardware lacks it")
    ap.add_argument('--rounds', type=int, default=6); ap.add_argument('--segment-s', type=float, default=1.5)
    ap.add_argument('--threads', default='auto', help="the workers' threads: a number, or auto (the cores other processes leave free)")
    ap.add_argument('--max-disagreement', type=float, default=1.5, help='refuse a ratio whose per-round ratios differ by more than this factor')
    ap.add_argument('--batch-size', type=int, default=32); ap.add_argument('--block-size', type=int, default=128)
    ap.add_argument('--objectives', default='electra,script', help='also time these against MLM (tiny preset); empty: skip')
    ap.add_argument('--roofline-presets', default='tiny,small,base', help='presets whose loop is put against the matmul peak; empty: skip')
    ap.add_argument('--compile', action='store_true', help="time nl_embryo's loop with torch.compile (PretrainConfig(compile=True))")
    ap.add_argument('--save', help='also write the figures as JSON to this file')
    ap.add_argument('--worker', help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        spec = json.loads(a.worker)
        return WORKERS[spec['loop']](spec)
    from nl_embryo.core import native_bf16
    from nl_embryo.models import build_model, flops_per_token
    dev = 'cuda' if torch.cuda.is_available() else 'cpu'
    precisions = [p for p in a.precisions.split(',') if p and (p != 'bf16' or native_bf16(dev))]
    if dev == 'cuda': precisions = ['bf16']
    opts = dict(rounds=a.rounds, segment_s=a.segment_s, threads=a.threads)
    B, T = a.batch_size, a.block_size
    out = dict(date=str(datetime.date.today()), machine=machine_line(dev, a.threads), batch=B, block=T, rounds=a.rounds,
               compile=a.compile, roofline={}, comparisons=[], objectives=[])   # compile: ours ran under torch.compile
    print(f"{out['date']} | {out['machine']}")
    print(f"batch {B} x {T} tokens; {a.rounds} interleaved rounds of ~{a.segment_s:g} s segments per comparison; "
          f"step times are the 25th percentile over clean segments (min / median / max beside them)", flush=True)
    check = lambda t, n, d: ratio(t, n, d, max_disagreement=a.max_disagreement)
    common = dict(batch=B, block=T)

    peak = {}                                         # precision -> the largest matmul rate measured (FLOP/s)
    roof = [p for p in a.roofline_presets.split(',') if p]
    if roof:
        from nl_embryo.models import PRESETS
        shapes = {f'{B * T}x{PRESETS[p].hidden}x{PRESETS[p].intermediate}': (B * T, PRESETS[p].hidden, PRESETS[p].intermediate) for p in roof}
        shapes['4096^3' if dev == 'cpu' else '8192^3'] = (4096,) * 3 if dev == 'cpu' else (8192,) * 3
        loops = {f'mm {p} {name}': argv(dict(loop='matmul', dtype=p, shape=list(s), repeat=1 if dev == 'cpu' else 10))
                 for p in precisions for name, s in shapes.items()}
        print(f"\nroofline: torch.mm at the presets' feed-forward shapes and a large one", flush=True)
        t = interleave(loops, **{**opts, 'rounds': max(3, a.rounds // 2)})
        for name in loops:
            s = t.stats(name)
            if s is None: print(f"  {describe(t, name)}"); continue
            rate = flops_of(t, name) / s['q25']
            p = name.split()[1]; peak[p] = max(peak.get(p, 0.0), rate)
            out['roofline'][name] = dict(tflops=rate / 1e12, threads=t.threads, **s)
            print(f"  {name:26s} {rate / 1e12:7.3f} TFLOP/s  ({describe(t, name, 's/product')})")
        print(f"  peak: " + ', '.join(f"{p} {v / 1e12:.3f} TFLOP/s" for p, v in peak.items()), flush=True)
        out['peak_tflops'] = {p: v / 1e12 for p, v in peak.items()}
    if dev == 'cuda':
        spec_peak = next((v for k, v in GPU_PEAK_BF16.items() if k in torch.cuda.get_device_name()), None)
        if spec_peak: print(f"  data-sheet dense bf16 peak of this GPU: {spec_peak / 1e12:.0f} TFLOP/s"); peak['bf16 (data sheet)'] = spec_peak

    for preset in dict.fromkeys([p for p in a.presets.split(',') if p] + roof):
        for prec in precisions:
            vs_trainer = preset in a.presets.split(',')
            loops = {'ours': argv(dict(loop='ours', preset=preset, arch='bert', precision=prec, compile=a.compile, **common))}
            if vs_trainer: loops['trainer'] = argv(dict(loop='trainer', preset=preset, precision=prec, **common))
            print(f"\nbert {preset} {prec}{' (ours with torch.compile)' if a.compile else ''}:", flush=True)
            t = interleave(loops, **opts)
            for name in loops: print(f"  {describe(t, name)}")
            s = t.stats('ours')
            if vs_trainer:
                r, line = check(t, 'trainer', 'ours')
                tok = lambda n: f"{B * T / t.stats(n)['q25']:,.0f} tok/s" if t.stats(n) else 'n/a'
                print(f"  => ours {tok('ours')} | HF Trainer {tok('trainer')} | " + (f"ratio {r:.2f}x ({line})" if r else line))
            row = dict(preset=preset, precision=prec, threads=t.threads, why_threads=t.why_threads, interference=t.interference(),
                       **{f'{n}': t.stats(n) for n in loops})
            if vs_trainer: row.update(ratio=r, ratio_line=line)
            out['comparisons'].append(row)
            if s and peak:
                rate = flops_of(t, 'ours') / s['q25']
                row.update(model_tflops=rate / 1e12, fraction_of_peak={p: rate / v for p, v in peak.items()})
                fr = ', '.join(f"{rate / v:.0%} of the {p} matmul peak" for p, v in peak.items())
                print(f"  => model FLOP/s (counter, forward x 3): {rate / 1e12:.3f} TFLOP/s = {fr}", flush=True)

    objectives = [o for o in a.objectives.split(',') if o]
    if objectives:
        prec = precisions[0]
        print(f"\nobjectives (tiny, {prec}): step time relative to MLM, and the FLOPs counter's ratio", flush=True)
        loops = {arch: argv(dict(loop='ours', preset='tiny', arch=arch, precision=prec, **common)) for arch in ['bert', *objectives]}
        t = interleave(loops, **opts)
        for name in loops: print(f"  {describe(t, name)}")
        for arch in objectives:
            r, line = check(t, arch, 'bert')
            counted = flops_of(t, arch) / flops_of(t, 'bert')
            out['objectives'].append(dict(arch=arch, ratio=r, ratio_line=line, counted=counted, threads=t.threads, stats=t.stats(arch), mlm=t.stats('bert')))
            print(f"  {arch:8s} {f'{r:.2f}x' if r else 'n/a'} MLM's step time (FLOPs counter: {counted:.2f}x"
                  + (f", measured / counted {r / counted:.2f}" if r else '') + f"); {line}", flush=True)
    if a.save: Path(a.save).write_text(json.dumps(out, indent=1) + '\n')


if __name__ == '__main__':
    main()
