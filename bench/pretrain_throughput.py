"""Pre-training throughput: nl_embryo's loop against the Hugging Face Trainer, measured in one run.

Same model (BERT `tiny` and `small` presets), same packed data (the `english` corpus), same batch and sequence
length, same optimizer (AdamW) and precision. The Trainer gets `DataCollatorForLanguageModeling` (15% masking, full
logits); nl_embryo computes the MLM output layer only at the masked positions. Prints tokens/s for each and the ratio,
and the ELECTRA and SCRIPT step times relative to MLM.

    python bench/pretrain_throughput.py [--presets tiny,small] [--steps 30] [--batch-size 32] [--block-size 128]

On a GPU the same script measures bf16 and prints the model FLOPs utilisation (MFU) of our loop.
"""
import argparse, json, statistics, tempfile, time
from pathlib import Path

import numpy as np
import torch


def our_tokens_per_s(preset, arch, steps, batch_size, block_size, out, precision='auto'):
    from nl_embryo.pretrain import PretrainConfig, pretrain
    run = pretrain(PretrainConfig(out=str(out), arch=arch, preset=preset, corpus='english', steps=steps, batch_size=batch_size,
                                  block_size=block_size, checkpoints=f'0,{steps}', eval_batches=0, precision=precision, warmup=0.1), quiet=True)
    rows = [json.loads(l) for l in (run/'metrics.jsonl').read_text().splitlines()]
    rates = [r['tokens_per_s'] for r in rows if 'tokens_per_s' in r][3:]          # skip warm-up steps
    flops = rows[-1]['step_flops']
    return statistics.median(rates), flops


def trainer_tokens_per_s(preset, steps, batch_size, block_size, out):
    from transformers import Trainer, TrainingArguments, DataCollatorForLanguageModeling, TrainerCallback
    from nl_embryo.corpora import load_corpus
    from nl_embryo.models import build_model
    corpus = load_corpus('english', block_size=block_size, quiet=True)
    tok = corpus.tokenizer()
    torch.manual_seed(0)
    model = build_model('bert', preset, vocab_size=len(tok), max_position=block_size)
    data = [{'input_ids': torch.from_numpy(np.asarray(b, dtype=np.int64))} for b in corpus.train[:steps * batch_size]]
    times = []
    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k): self.t = time.perf_counter()
        def on_step_end(self, *a, **k): times.append(time.perf_counter() - self.t)
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=batch_size, max_steps=steps, learning_rate=1e-3,
                             warmup_steps=max(1, steps // 10), save_strategy='no', report_to='none', logging_steps=10_000,
                             dataloader_num_workers=0, use_cpu=not torch.cuda.is_available(), bf16=torch.cuda.is_available(),
                             disable_tqdm=True, optim='adamw_torch')
    collator = DataCollatorForLanguageModeling(tok, mlm=True, mlm_probability=0.15)
    Trainer(model=model, args=args, train_dataset=data, data_collator=collator, callbacks=[Clock()]).train()
    return batch_size * block_size / statistics.median(times[3:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--presets', default='tiny,small'); ap.add_argument('--steps', type=int, default=30)
    ap.add_argument('--batch-size', type=int, default=32); ap.add_argument('--block-size', type=int, default=128)
    ap.add_argument('--objectives', default='electra,script', help='also time these against MLM (tiny preset)')
    a = ap.parse_args()
    dev = 'cuda' if torch.cuda.is_available() else 'cpu'
    print(f"device {dev} ({torch.cuda.get_device_name() if dev == 'cuda' else f'{torch.get_num_threads()} threads'}), "
          f"batch {a.batch_size} x {a.block_size} tokens, {a.steps} steps (median of steps after the first 3)")
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        for preset in a.presets.split(','):
            ours, flops = our_tokens_per_s(preset, 'bert', a.steps, a.batch_size, a.block_size, d/f'ours-{preset}')
            theirs = trainer_tokens_per_s(preset, a.steps, a.batch_size, a.block_size, d/f'hf-{preset}')
            line = f"bert {preset:6s} ours {ours:10,.0f} tok/s | HF Trainer {theirs:10,.0f} tok/s | ratio {ours / theirs:5.2f}x"
            if dev == 'cuda':
                peak = 989e12 if 'H100' in torch.cuda.get_device_name() else 790e12 if 'H200' in torch.cuda.get_device_name() else None
                if peak: line += f" | MFU {flops * ours / (a.batch_size * a.block_size) / peak:.1%}"
            print(line, flush=True)
        if a.objectives:
            base, _ = our_tokens_per_s('tiny', 'bert', a.steps, a.batch_size, a.block_size, d/'mlm')
            for arch in a.objectives.split(','):
                r, _ = our_tokens_per_s('tiny', arch, a.steps, a.batch_size, a.block_size, d/arch)
                print(f"{arch:8s} tiny step time relative to MLM: {base / r:4.2f}x", flush=True)


if __name__ == '__main__':
    main()
