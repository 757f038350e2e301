"""Integration and fault tests of pre-training: exact resume after SIGKILL, 2-process Accelerate, --resume after a NaN with
another learning rate, clipping and schedule, what --resume refuses to change (config.json lost included), metrics
rewritten atomically on resume, each step once (a resume from step 0, a cut line named), bad input named before anything
is written."""
import json, os, signal, subprocess, time, errno, shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import nl_embryo_cmd, poison_mlm_loss, BIN, cli, train, weights
from nl_embryo.core import NlEmbryoError
from nl_embryo.pretrain import PretrainConfig, pretrain
from nl_embryo.checkpoints import list_checkpoints
import nl_embryo.pretrain as P

pytestmark = pytest.mark.usefixtures('one_torch_thread')

TINY = dict(corpus='nested-zipf', block_size=32, corpus_tokens=40_000, batch_size=8, lr=2e-3, preset='tiny')
CLI_TINY = ['--corpus', 'nested-zipf', '--block-size', 32, '--corpus-tokens', 40_000, '--batch-size', 8, '--lr', 2e-3, '--preset', 'tiny']


def test_kill_and_resume_is_exact(tmp_path, small_corpus):
    steps = 30
    args = [*CLI_TINY, '--steps', steps, '--checkpoints', 'linear:4', '--quiet']
    env = dict(os.environ, OMP_NUM_THREADS='1')
    ref = tmp_path/'ref'
    subprocess.run(nl_embryo_cmd('pretrain', *args, '--out', ref), check=True, env=env, capture_output=True)
    run = tmp_path/'killed'
    rng = np.random.default_rng()
    p = subprocess.Popen(nl_embryo_cmd('pretrain', *args, '--out', run), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # wait until a few checkpoints exist, then kill at a random moment
    t0 = time.time()
    while not (run/'checkpoints'/'step8').exists() and time.time() - t0 < 120: time.sleep(0.01)
    time.sleep(float(rng.uniform(0, 0.5)))
    p.send_signal(signal.SIGKILL); p.wait()
    done_before = max(list_checkpoints(run, warn=False))
    assert done_before < steps, 'the run finished before it was killed: make it longer'
    r = subprocess.run(nl_embryo_cmd('pretrain', *args, '--out', run, '--resume'), env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    a, b = weights(ref, steps), weights(run, steps)
    assert a.keys() == b.keys()
    for k in a: assert torch.equal(a[k], b[k]), k
    m = [json.loads(l) for l in (run/'metrics.jsonl').read_text().splitlines()]
    assert [r['step'] for r in m] == list(range(0, steps + 1))     # no duplicated or missing steps after resume


def test_half_written_checkpoint_is_skipped(tmp_path, small_corpus):
    run = pretrain(PretrainConfig(out=str(tmp_path/'r'), steps=6, checkpoints='0,3,6', **TINY), quiet=True)
    (run/'checkpoints'/'step6'/'optimizer.safetensors').unlink()        # as if the save had been cut short
    with pytest.warns(UserWarning, match='half-written'):
        cks = list_checkpoints(run)
    assert list(cks) == [0, 3]
    with pytest.warns(UserWarning):
        pretrain(PretrainConfig(out=str(run), steps=6, checkpoints='0,3,6', **TINY), resume=True, quiet=True)
    assert list(list_checkpoints(run)) == [0, 3, 6]


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, small_corpus, monkeypatch):
    poison_mlm_loss(monkeypatch, at_call=8)        # training step 5: the one-batch evals of steps 0, 2 and 4 are calls too
    with pytest.raises(NlEmbryoError, match=r'loss became nan at step 5.*last good checkpoint is step4'):
        pretrain(PretrainConfig(out=str(tmp_path/'r'), steps=10, checkpoints='0,2,4,8', eval_batches=1, **TINY), quiet=True)
    assert list(list_checkpoints(tmp_path/'r')) == [0, 2, 4]


def test_disk_full_during_save(tmp_path, small_corpus, monkeypatch):
    import safetensors.torch as st
    real = st.save_file
    def full(tensors, filename, *a, **k):
        if 'step4' in str(Path(filename).parent.name) or '.step4' in str(filename):
            raise OSError(errno.ENOSPC, 'No space left on device')
        return real(tensors, filename, *a, **k)
    monkeypatch.setattr(st, 'save_file', full)
    with pytest.raises(NlEmbryoError, match='disk is full.*step4'):
        pretrain(PretrainConfig(out=str(tmp_path/'r'), steps=6, checkpoints='0,2,4,6', **TINY), quiet=True)
    cks = list_checkpoints(tmp_path/'r')
    assert list(cks) == [0, 2]
    assert not [p for p in (tmp_path/'r'/'checkpoints').iterdir() if p.name.startswith('.')]


@pytest.mark.parametrize('bad, match', [
    (dict(preset='huge'), 'unknown preset'), (dict(corpus='klingon'), 'unknown corpus'),
    (dict(objective='gpt'), 'unknown objective'), (dict(arch='bert', objective='electra'), 'does not fit'),
    (dict(arch='lstm'), 'unknown architecture'), (dict(checkpoints='often'), 'bad checkpoint spec'),
])
def test_bad_options(tmp_path, bad, match):
    with pytest.raises(NlEmbryoError, match=match):
        pretrain(PretrainConfig(out=str(tmp_path/'r'), **dict(TINY, **bad)), quiet=True)


def test_existing_run_needs_resume(tmp_path, small_corpus):
    pretrain(PretrainConfig(out=str(tmp_path/'r'), steps=2, **TINY), quiet=True)
    with pytest.raises(NlEmbryoError, match='already holds a run'):
        pretrain(PretrainConfig(out=str(tmp_path/'r'), steps=2, **TINY), quiet=True)
    with pytest.raises(NlEmbryoError, match=r'--resume cannot change batch_size \(8 -> 16\)'):
        pretrain(PretrainConfig(out=str(tmp_path/'r'), steps=4, **dict(TINY, batch_size=16)), resume=True, quiet=True)


def test_too_short_corpus(tmp_path):
    from nl_embryo.corpora import build_corpus
    with pytest.raises(NlEmbryoError, match='too short'):
        build_corpus('nested-zipf', block_size=512, n_tokens=600, quiet=True)


def test_cli_error_is_clean(tmp_path, capsys):
    r = subprocess.run(nl_embryo_cmd('pretrain', '--preset', 'huge', '--out', tmp_path/'r'), capture_output=True, text=True)
    # the parser knows the presets: it names the bad value and the choices, before anything is written (the console script)
    assert r.returncode == 2 and "invalid choice: 'huge'" in r.stderr and "'mini', 'tiny', 'tiny2', 'small', 'base'" in r.stderr
    assert 'Traceback' not in r.stderr and not (tmp_path/'r').exists()
    rc, said = cli(capsys, 'pretrain', '--preset', 'mini', '--lr', '-1', '--out', tmp_path/'r')   # a value only the config can judge (`main` here)
    assert rc == 2 and '--lr -1.0 is not a learning rate' in said and 'fix:' in said and 'Traceback' not in said and not (tmp_path/'r').exists()


@pytest.mark.filterwarnings('ignore:.*unigram plateau')                # 6 steps end on it
@pytest.mark.parametrize('arch, preset', [('bert', 'tiny'), ('gpt-neox', 'mini')])   # masked and causal (next-token) objectives
def test_two_process_gloo_equals_accumulation(tmp_path, small_corpus, arch, preset):
    """2 CPU processes (DDP over gloo, through Accelerate) train, and compute the same update as 1 process x 2 accumulation
    steps; both log the whole batch's loss."""
    out = tmp_path/'ddp'
    args = [*map(str, CLI_TINY), '--arch', arch, '--preset', preset, '--steps', '6', '--checkpoints', '0,6', '--quiet']
    env = dict(os.environ, OMP_NUM_THREADS='1')
    r = subprocess.run([str(BIN/'torchrun'), '--nproc_per_node', '2', '--standalone', str(BIN/'nl-embryo'), 'pretrain', *args, '--out', str(out)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads((out/'config.json').read_text())
    assert info['processes'] == 2 and info['config']['objective'] == ('clm' if arch == 'gpt-neox' else 'mlm')
    m = [json.loads(l) for l in (out/'metrics.jsonl').read_text().splitlines()]
    assert m[-1]['step'] == 6 and m[-1]['tokens_seen'] == 6 * 8 * 32
    single = pretrain(PretrainConfig(out=str(tmp_path/'accum'), **dict(TINY, arch=arch, preset=preset), steps=6, checkpoints='0,6', grad_accum=2), quiet=True)
    a, b = weights(out, 6), weights(single, 6)
    changed = [k for k in a if not torch.equal(a[k], weights(out, 0)[k])]
    assert changed, 'DDP run did not update the weights'
    for k in a: assert torch.allclose(a[k], b[k], atol=1e-5, rtol=1e-4), k
    m1 = [json.loads(l) for l in (single/'metrics.jsonl').read_text().splitlines()]
    loss = 'clm_loss' if arch == 'gpt-neox' else 'mlm_loss'
    assert np.allclose([row[loss] for row in m[1:]], [row[loss] for row in m1[1:]], rtol=1e-4)   # each step's loss: the whole batch's, not process 0's half


def test_empty_corpus(monkeypatch):
    import nl_embryo.corpora as C
    spec = C.CORPORA['turkish']
    monkeypatch.setitem(C.CORPORA, 'turkish', C.CorpusSpec('turkish', 'turkish', spec.description, lambda n, s, t: []))
    with pytest.raises(NlEmbryoError, match="corpus 'turkish' is empty"):
        C.build_corpus('turkish', block_size=64, force=True, quiet=True)


def test_half_precision_checkpoints(tmp_path, small_corpus):
    run = pretrain(PretrainConfig(out=str(tmp_path/'h'), steps=3, checkpoints='0,3', half_checkpoints=True, **TINY), quiet=True)
    w = weights(run, 3)
    assert all(t.dtype == torch.bfloat16 for t in w.values() if t.is_floating_point())
    full = pretrain(PretrainConfig(out=str(tmp_path/'f'), steps=3, checkpoints='0,3', **TINY), quiet=True)
    size = lambda r: (Path(r)/'checkpoints'/'step3'/'model.safetensors').stat().st_size
    assert size(run) < 0.6 * size(full)
    from nl_embryo.timeline import Run
    model, tok = Run(run).load(3)                 # loaded in float32, the stored bfloat16 values widened exactly
    assert {p.dtype for p in model.parameters()} == {torch.float32} and len(tok) == model.config.vocab_size
    assert all(torch.equal(model.state_dict()[k], t.float()) for k, t in w.items() if t.is_floating_point() and k in model.state_dict())


def test_tokenizer_mismatch_is_refused(small_corpus):
    from nl_embryo.models import build_model, check_tokenizer_matches
    with pytest.raises(NlEmbryoError, match='vocab_size=500 but the tokenizer has 8000'):
        check_tokenizer_matches(build_model('bert', 'tiny', vocab_size=500), small_corpus.tokenizer())


# --- --resume with another learning rate, clipping or schedule; what it refuses; the metrics it rewrites -------------

def test_nan_advice_works_resume_with_a_lower_lr(tmp_path, small_corpus, monkeypatch):
    poison_mlm_loss(monkeypatch, at_call=6)        # training step 4: the one-batch evals of steps 0 and 2 are calls too
    run = tmp_path/'run'
    with pytest.raises(NlEmbryoError, match=r'loss became nan at step 4.*last good checkpoint is step2') as e:
        train(run, steps=6, checkpoints='0,2,4,6', eval_batches=1)
    assert 'lower --lr' in e.value.fix and '--resume' in e.value.fix
    monkeypatch.undo()                                           # the cause of the NaN is gone
    train(run, steps=6, checkpoints='0,2,4,6', eval_batches=1, lr=1e-3, max_grad_norm=0.5, schedule='cosine', resume=True)
    info = json.loads((run/'config.json').read_text())
    assert info['history'] == [dict(from_step=0, lr=2e-3, schedule='triangle', warmup=0.5, max_grad_norm=1.0),
                               dict(from_step=2, lr=1e-3, schedule='cosine', warmup=0.5, max_grad_norm=0.5)]
    m = [json.loads(l) for l in (run/'metrics.jsonl').read_text().splitlines()]
    assert [r['step'] for r in m] == list(range(7))
    assert m[3]['lr'] == pytest.approx(1e-3 * P.lr_at(2, 6, 3, 'cosine'))       # step 3 trained with the new segment
    assert list(list_checkpoints(run)) == [0, 2, 4, 6]


def test_resume_refuses_data_model_and_batch_changes(tmp_path, reference):
    run = tmp_path/'run'; shutil.copytree(reference, run)
    for bad, said in [(dict(batch_size=16), 'batch_size (8 -> 16)'), (dict(seed=1), 'seed (0 -> 1)'), (dict(preset='tiny'), "preset ('mini' -> 'tiny')")]:
        with pytest.raises(NlEmbryoError, match=r'--resume cannot change') as e: train(run, steps=6, resume=True, **bad)
        assert said in str(e.value) and '--lr' in e.value.fix
    assert list(list_checkpoints(run)) == [0, 2, 4]
    info = json.loads((run/'config.json').read_text())           # a corpus built anew, with other blocks, since the run started
    info['corpus']['n_train_blocks'] += 1; (run/'config.json').write_text(json.dumps(info))
    with pytest.raises(NlEmbryoError, match=r"corpus 'nested-zipf' is not the build the run in .* started on: its n_train_blocks (\d+) -> (\d+); resuming") as e:
        train(run, steps=6, resume=True)
    assert 'start a new run' in e.value.fix and list(list_checkpoints(run)) == [0, 2, 4] and json.loads((run/'config.json').read_text()) == info


def test_metrics_are_rewritten_atomically_on_resume(tmp_path, reference, monkeypatch):
    run = tmp_path/'run'; shutil.copytree(reference, run)
    written = []
    real = P.atomic_write_text
    monkeypatch.setattr(P, 'atomic_write_text', lambda path, text: written.append(Path(path).name) or real(path, text))
    train(run, steps=6, checkpoints='0,2,4,6', resume=True)
    assert 'metrics.jsonl' in written
    assert [json.loads(l)['step'] for l in (run/'metrics.jsonl').read_text().splitlines()] == list(range(7))


def _metric_steps(run) -> list[int]:
    "The steps of a run's metrics.jsonl, in file order (every line must parse)."
    return [json.loads(l)['step'] for l in (run/'metrics.jsonl').read_text().splitlines()]


def test_resume_from_step_0_keeps_one_step_0_row_and_its_checkpoint(tmp_path, reference):
    run = tmp_path/'run'; shutil.copytree(reference, run)
    for s in (2, 4): shutil.rmtree(run/'checkpoints'/f'step{s}')
    step0 = {p.name: p.stat().st_mtime_ns for p in (run/'checkpoints'/'step0').iterdir()}
    train(run, steps=4, resume=True)
    assert _metric_steps(run) == [0, 1, 2, 3, 4]                           # the step-0 row once
    assert {p.name: p.stat().st_mtime_ns for p in (run/'checkpoints'/'step0').iterdir()} == step0   # never written again
    assert all(torch.equal(a, b) for a, b in zip(weights(run, 4).values(), weights(reference, 4).values()))


def test_metrics_cut_mid_line_are_named_on_resume_and_rewritten_whole(tmp_path, reference):
    from conftest import MINI
    run = tmp_path/'run'; shutil.copytree(reference, run)
    lines = (run/'metrics.jsonl').read_text().splitlines(keepends=True)
    (run/'metrics.jsonl').write_text(''.join(lines[:2]) + lines[2][:len(lines[2]) // 2])    # cut in the row of step 2
    with pytest.warns(UserWarning, match=r"metrics.jsonl lost the rows of step\(s\) 2-4, the eval rows of step\(s\) 2, 4 among them "
                                         r"\(1 line\(s\) cut or garbled were dropped\): the run continues from step4") as got:
        pretrain(PretrainConfig(out=str(run), steps=6, checkpoints='0,2,4,6', **MINI), resume=True, quiet=True)
    assert len([w for w in got if 'lost the rows' in str(w.message)]) == 1
    steps = _metric_steps(run)                                             # parses whole
    assert steps == [0, 1, 5, 6] and len(set(steps)) == len(steps)


def test_resume_without_config_json_checks_the_options_of_the_checkpoint(tmp_path, reference):
    run = tmp_path/'run'; shutil.copytree(reference, run)
    (run/'config.json').unlink()
    with pytest.raises(NlEmbryoError, match=r'--resume cannot change batch_size \(8 -> 4\)') as e: train(run, steps=6, resume=True, batch_size=4)
    assert '--lr' in e.value.fix and list(list_checkpoints(run)) == [0, 2, 4] and not (run/'config.json').exists()
    train(run, steps=6, checkpoints='0,2,4,6', resume=True)                 # its own options continue it
    assert json.loads((run/'config.json').read_text())['config']['batch_size'] == 8 and _metric_steps(run) == list(range(7))


# --- bad input named before anything is written --------------------------------------------------------------------

@pytest.mark.parametrize('flags, said', [(['--lr', 'nan'], '--lr nan is not a learning rate'), (['--lr', '-1'], '--lr -1.0 is not a learning rate'),
                                         (['--batch-size', '0'], '--batch-size 0 must be at least 1'),
                                         (['--max-grad-norm', 'nan'], '--max-grad-norm nan')])
def test_bad_pretrain_numbers_are_named_before_anything_is_written(tmp_path, capsys, flags, said):
    rc, err = cli(capsys, 'pretrain', '--preset', 'mini', '--corpus', 'nested-zipf', '--out', tmp_path/'run', *flags)
    assert rc == 2 and said in err and 'fix:' in err and 'Traceback' not in err
    assert not (tmp_path/'run').exists()


def test_out_pointing_to_a_file(tmp_path, capsys):
    (tmp_path/'notes.txt').write_text('mine')
    rc, err = cli(capsys, 'pretrain', '--preset', 'mini', '--out', tmp_path/'notes.txt')
    assert rc == 2 and 'is a file, not a folder' in err
    assert (tmp_path/'notes.txt').read_text() == 'mine'


# --- memory: a step that cannot fit is refused before the run writes anything; one that fails later is named ---------

def test_a_step_that_cannot_fit_is_refused_before_anything_is_written(tmp_path, capsys):
    # 64 blocks of 16,384 tokens: the attention weights alone are about 0.5 TB (this test holds on any machine with less)
    rc, err = cli(capsys, 'pretrain', '--corpus', 'english', '--block-size', 16384, '--batch-size', 64, '--preset', 'tiny', '--out', tmp_path/'run', '--quiet')
    assert rc == 2 and 'Traceback' not in err, err[-2000:]
    assert 'needs at least' in err and '--grad-accum' in err, err
    from nl_embryo.core import native_bf16
    if P.training_attention('cpu', native_bf16('cpu')) == 'eager':       # eager attention keeps its weights: they dominate
        assert 'square of the block' in err, err
    assert not (tmp_path/'run').exists() or not any((tmp_path/'run').iterdir())


@pytest.mark.filterwarnings('ignore:.*unigram plateau')
def test_out_of_memory_during_training_is_named_and_the_checkpoints_are_kept(tmp_path, small_corpus, monkeypatch):
    real, calls = P._forward_backward, {'n': 0}
    def fails_at_step_3(*a, **k):
        calls['n'] += 1
        if calls['n'] == 3: raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate 9663676416 bytes")
        return real(*a, **k)
    monkeypatch.setattr(P, '_forward_backward', fails_at_step_3)
    run = tmp_path/'r'
    with pytest.raises(NlEmbryoError, match=r'out of memory on cpu with 8 blocks of 32 tokens.*checkpoints up to step2') as e:
        pretrain(PretrainConfig(out=str(run), steps=4, checkpoints='0,2,4', eval_batches=1, **TINY), quiet=True)
    assert '--grad-accum' in e.value.fix and list(list_checkpoints(run)) == [0, 2]
    monkeypatch.setattr(P, '_forward_backward', real)
    train_again = pretrain(PretrainConfig(out=str(run), steps=4, checkpoints='0,2,4', eval_batches=1, **TINY), resume=True, quiet=True)
    assert list(list_checkpoints(train_again)) == [0, 2, 4]


@pytest.mark.parametrize('arch, preset, block, micro, bf16, attention', [('bert', 'mini', 256, 4, False, 'sdpa'), ('bert', 'tiny2', 512, 4, True, 'eager'),
                                                                       ('gpt-neox', 'mini', 256, 4, False, 'sdpa')])
def test_the_memory_bound_is_below_what_a_step_keeps(arch, preset, block, micro, bf16, attention):
    # `training_memory` must not exceed what a step takes, else `pretrain` would refuse runs that fit: the activations the
    # forward pass leaves for the backward one (the bytes malloc holds after it, less those before) are at least the bound's
    # (bench/training_memory.py compares whole steps' peak memory, in processes of their own)
    import ctypes
    from nl_embryo.models import build_model, set_attention
    from nl_embryo.objectives import OBJECTIVES, step_generator
    class Mallinfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ('arena', 'ordblks', 'smblks', 'hblks', 'hblkhd', 'usmblks', 'fsmblks', 'uordblks', 'fordblks', 'keepcost')]
    libc = ctypes.CDLL('libc.so.6'); libc.mallinfo2.restype = Mallinfo2
    in_use = lambda: (lambda m: m.uordblks + m.hblkhd)(libc.mallinfo2())   # bytes in use: small blocks and mapped ones
    model = build_model(arch, preset, vocab_size=8000, max_position=block); set_attention(model, attention)
    ids = torch.randint(5, 8000, (micro, block), generator=torch.Generator().manual_seed(0))
    before = in_use()
    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=bf16):
        out = OBJECTIVES['clm' if arch == 'gpt-neox' else 'mlm'](model, ids, step_generator(0, 0), vocab_size=8000)
    kept = in_use() - before
    bound = P.training_memory(model, micro, block, bf16, attention, causal=arch == 'gpt-neox')['activations']
    assert out['loss'].requires_grad and 0 < bound <= kept, (bound, kept)
