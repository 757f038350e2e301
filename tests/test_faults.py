"""Faults injected on purpose: damaged checkpoints, NaN restarts with a new learning rate, a full disk, pickled
weights, fetched data that changed, and bad input named before anything is written. Each test takes seconds."""
import errno, json, os, shutil, warnings
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from conftest import poison_mlm_loss
from nl_embryo.core import NlEmbryoError
from nl_embryo.pretrain import PretrainConfig, pretrain, list_checkpoints, checkpoint_problem, CHECKPOINT_MANIFEST
import nl_embryo.pretrain as P

MINI = dict(corpus='nested-zipf', block_size=32, corpus_tokens=40_000, batch_size=8, lr=2e-3, preset='mini', eval_batches=1)


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread): yield


def train(out, steps=4, checkpoints='0,2,4', resume=False, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        return pretrain(PretrainConfig(out=str(out), steps=steps, checkpoints=checkpoints, **dict(MINI, **kw)), resume=resume, quiet=True)


def weights(run, step):
    return load_file(str(Path(run)/'checkpoints'/f'step{step}'/'model.safetensors'))


def same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope='module')
def reference(tmp_path_factory, small_corpus, one_torch_thread):
    "An uninterrupted 4-step run (checkpoints 0, 2, 4)."
    return train(tmp_path_factory.mktemp('ref')/'run')


# --- 1. damaged checkpoints ---------------------------------------------------------------------------------------

def test_checkpoint_has_a_manifest_written_last(reference):
    ck = reference/'checkpoints'/'step4'
    files = json.loads((ck/CHECKPOINT_MANIFEST).read_text())['files']
    assert {'model.safetensors', 'optimizer.safetensors', 'trainer_state.json'} <= set(files)
    assert all(files[f]['size'] == (ck/f).stat().st_size and len(files[f]['sha256']) == 64 for f in files)
    assert checkpoint_problem(ck) is None and checkpoint_problem(ck, full=True) is None


def test_truncated_weights_are_skipped_named_and_resumed_from_the_last_good(tmp_path, reference):
    from nl_embryo.timeline import Run
    run = tmp_path/'run'; shutil.copytree(reference, run)
    w = run/'checkpoints'/'step4'/'model.safetensors'
    w.write_bytes(w.read_bytes()[:w.stat().st_size // 2])
    r = Run(run)
    assert r.steps() == [0, 2] and 4 in r.damaged()
    with pytest.raises(NlEmbryoError, match=r'step4 .* is damaged: model.safetensors has \d+ bytes') as e: r.load(4)
    assert '--resume' in e.value.fix
    model, _ = r.load()                                                # the newest good one
    sd, w2 = model.state_dict(), weights(run, 2)
    assert all(torch.equal(sd[k], w2[k]) for k in w2 if k in sd) and any(k in sd for k in w2)
    with pytest.warns(UserWarning, match=r'skipped the damaged checkpoint\(s\) step4 .*continues from step2'):
        pretrain(PretrainConfig(out=str(run), steps=4, checkpoints='0,2,4', **MINI), resume=True, quiet=True)
    assert Run(run).steps() == [0, 2, 4]
    assert same_weights(weights(run, 4), weights(reference, 4))      # the continuation is exact
    steps = [json.loads(l)['step'] for l in (run/'metrics.jsonl').read_text().splitlines()]
    assert steps == [0, 1, 2, 3, 4]


def test_garbled_trainer_state_is_named(tmp_path, reference):
    from nl_embryo.timeline import Run
    run = tmp_path/'run'; shutil.copytree(reference, run)
    ts = run/'checkpoints'/'step4'/'trainer_state.json'
    ts.write_bytes(b'{"step": 4, garbage' + b' ' * (ts.stat().st_size - 19))        # same size: only the parse sees it
    assert Run(run).steps() == [0, 2]
    with pytest.raises(NlEmbryoError, match='trainer_state.json is not valid JSON'): Run(run).load(4)
    with pytest.raises(NlEmbryoError, match='damaged'): Run(run).map(lambda m, t, d: pd.DataFrame({'x': [1]}), steps=[4], progress=False)


def test_checkpoint_without_a_manifest_still_loads_and_is_checked_by_parsing(tmp_path, reference):
    from nl_embryo.timeline import Run
    run = tmp_path/'run'; shutil.copytree(reference, run)
    for m in run.glob('checkpoints/*/' + CHECKPOINT_MANIFEST): m.unlink()     # as written before manifests
    assert Run(run).steps() == [0, 2, 4]
    Run(run).load(4)
    w = run/'checkpoints'/'step4'/'optimizer.safetensors'
    w.write_bytes(w.read_bytes()[:-100])
    assert Run(run).steps() == [0, 2]
    assert 'optimizer.safetensors is cut short' in Run(run).damaged()[4]


def test_a_changed_byte_is_found_by_the_full_check(tmp_path, reference):
    run = tmp_path/'run'; shutil.copytree(reference, run)
    w = run/'checkpoints'/'step2'/'model.safetensors'
    b = bytearray(w.read_bytes()); b[-1] ^= 0xFF; w.write_bytes(bytes(b))
    assert checkpoint_problem(w.parent) is None                         # sizes and headers are fine
    with pytest.raises(NlEmbryoError, match='model.safetensors changed after it was written'): P.verify_checkpoint(w.parent)


def test_interrupted_save_folders_are_removed_on_resume(tmp_path, reference):
    run = tmp_path/'run'; shutil.copytree(reference, run)
    junk = run/'checkpoints'/'.step6.tmp-0123abcd'; junk.mkdir(); (junk/'model.safetensors').write_bytes(b'half')
    train(run, steps=6, checkpoints='0,2,4,6', resume=True)
    assert not junk.exists() and list(list_checkpoints(run)) == [0, 2, 4, 6]


# --- 2. --resume with another learning rate, clipping or schedule ----------------------------------------------------

def test_nan_advice_works_resume_with_a_lower_lr(tmp_path, small_corpus, monkeypatch):
    poison_mlm_loss(monkeypatch, at_call=4)
    run = tmp_path/'run'
    with pytest.raises(NlEmbryoError, match=r'loss became nan at step 4.*last good checkpoint is step2') as e:
        train(run, steps=6, checkpoints='0,2,4,6', eval_batches=0)
    assert 'lower --lr' in e.value.fix and '--resume' in e.value.fix
    monkeypatch.undo()                                           # the cause of the NaN is gone
    train(run, steps=6, checkpoints='0,2,4,6', eval_batches=0, lr=1e-3, max_grad_norm=0.5, schedule='cosine', resume=True)
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


# --- 3. a full disk ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize('error', [lambda: OSError(errno.ENOSPC, 'No space left on device'),
                                   lambda: __import__('safetensors').SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })')])
def test_full_disk_during_a_save_is_one_clear_message(tmp_path, small_corpus, monkeypatch, error):
    import safetensors.torch as st
    real = st.save_file
    def full(tensors, filename, *a, **k):
        if '.step4.' in str(filename): raise error()
        return real(tensors, filename, *a, **k)
    monkeypatch.setattr(st, 'save_file', full)
    run = tmp_path/'run'
    with pytest.raises(NlEmbryoError, match='the disk is full: checkpoint step4') as e: train(run, steps=4)
    assert '--resume' in e.value.fix
    assert list(list_checkpoints(run)) == [0, 2]                         # the earlier checkpoints are intact
    assert not [p for p in (run/'checkpoints').iterdir() if p.name.startswith('.')]     # the partial folder is gone


# --- 5. safetensors only ----------------------------------------------------------------------------------------------

class _WritesAFile:
    "Unpickling this writes a file."
    def __init__(self, path): self.path = str(path)
    def __reduce__(self): return (exec, (f"open({self.path!r}, 'w').write('pwned')",))


def test_pickled_weights_are_refused_without_unpickling(tmp_path, reference):
    from nl_embryo.models import load_model, convert_to_safetensors
    from nl_embryo.timeline import Run
    folder = tmp_path/'model'; shutil.copytree(reference/'checkpoints'/'step4', folder)
    (folder/'model.safetensors').unlink()
    marker = tmp_path/'pwned'
    torch.save({'w': _WritesAFile(marker)}, folder/'pytorch_model.bin')
    with pytest.raises(NlEmbryoError, match='no safetensors weights') as e: load_model(folder)
    assert 'convert_to_safetensors' in e.value.fix
    with pytest.raises(NlEmbryoError, match='no safetensors weights'): Run(folder).load()
    with pytest.raises(NlEmbryoError, match=r'the pickle names \S*exec'): convert_to_safetensors(folder)
    assert not marker.exists() and not (folder/'model.safetensors').exists()


def test_a_trusted_state_dict_converts_and_loads(tmp_path, reference):
    from nl_embryo.models import load_model, convert_to_safetensors
    folder = tmp_path/'model'; shutil.copytree(reference/'checkpoints'/'step4', folder)
    sd = load_file(str(folder/'model.safetensors')); (folder/'model.safetensors').unlink()
    torch.save(sd, folder/'pytorch_model.bin')
    convert_to_safetensors(folder)
    m = load_model(folder)
    for k, v in sd.items(): assert torch.equal(m.state_dict()[k], v), k


# --- 6. bad input named before anything is written ------------------------------------------------------------------

def cli(capsys, *args):
    from nl_embryo.cli import main
    rc = main([str(a) for a in args])
    got = capsys.readouterr()
    return rc, got.out + got.err


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


def test_analyze_bad_steps(tmp_path, capsys, reference):
    rc, err = cli(capsys, 'analyze', reference, '--steps', '0,abc')
    assert rc == 2 and "--steps '0,abc' is not a list of step numbers" in err and 'fix:' in err
    rc, err = cli(capsys, 'analyze', reference, '--steps', '0,3')
    assert rc == 2 and 'no checkpoint at step 3' in err


# --- 4. fetched data that changed ------------------------------------------------------------------------------------

@pytest.fixture
def toy_source(tmp_path, monkeypatch):
    "A source fetched into a temporary data cache (NL_EMBRYO_DATA) from a zip placed in downloads/, so nothing is downloaded."
    import hashlib, zipfile
    cache = tmp_path/'cache'; (cache/'downloads').mkdir(parents=True)
    art = cache/'downloads'/'toy-1.0.zip'
    with zipfile.ZipFile(art, 'w') as z:
        z.writestr('toy/a.txt', 'alpha\n'); z.writestr('toy/sub/b.txt', 'beta\n'); z.writestr('other/c.txt', 'not kept\n')
    sha = hashlib.sha256(art.read_bytes()).hexdigest()
    toml = tmp_path/'manifest.toml'
    toml.write_text(f'[[source]]\nname = "toy"\nregistry = "pypi"\npackage = "toy"\nversion = "1.0"\nfilename = "toy-1.0.zip"\n'
                    f'sha256 = "{sha}"\nmembers = ["toy/*"]\n')
    monkeypatch.setenv('NL_EMBRYO_DATA', str(cache)); monkeypatch.setenv('NL_EMBRYO_MANIFEST', str(toml))
    from nl_embryo.data import fetch
    shutil.copy(art, tmp_path/'toy-1.0.zip')                               # fetch removes the artifact it unpacked
    return fetch(['toy'], quiet=True)['toy']


def test_a_changed_fetched_file_is_named_with_the_fix(toy_source, capsys):
    from nl_embryo.data import fetched_path, fetch, data_status, verify_data, FILE_MANIFEST
    listed = json.loads((toy_source/FILE_MANIFEST).read_text())['files']
    assert set(listed) == {'toy/a.txt', 'toy/sub/b.txt'} and all(len(v['sha256']) == 64 for v in listed.values())
    assert fetched_path('toy') == toy_source and verify_data(['toy'])['status'].tolist() == ['ok']
    (toy_source/'toy'/'sub'/'b.txt').write_text('BETA\n')                     # same size, new mtime: the cheap check sees it
    for call in (lambda: fetched_path('toy'), lambda: fetch(['toy'], quiet=True)):
        with pytest.raises(NlEmbryoError, match=r"data source 'toy' changed since it was fetched .*toy/sub/b.txt was modified") as e: call()
        assert '`nl-embryo data fetch toy --force`' in e.value.fix
    assert data_status().set_index('name').loc['toy', 'status'] == 'changed'
    rc, err = cli(capsys, 'data', 'verify', 'toy')
    assert rc == 2 and 'toy/sub/b.txt changed (its sha256 differs' in err and '`nl-embryo data fetch toy --force`' in err
    shutil.copy(toy_source.parent.parent.parent/'toy-1.0.zip', toy_source.parent.parent/'downloads')   # offline: the artifact by hand
    fetch(['toy'], force=True, quiet=True)                                     # the fix
    assert fetched_path('toy') == toy_source and (toy_source/'toy'/'sub'/'b.txt').read_text() == 'beta\n'


def test_full_check_tells_a_touched_file_from_a_changed_one(toy_source):
    from nl_embryo.data import source_changes
    a = toy_source/'toy'/'a.txt'
    os.utime(a, ns=(a.stat().st_atime_ns, a.stat().st_mtime_ns + 10**9))       # touched, not changed
    assert source_changes('toy') == ['toy/a.txt was modified after the fetch'] and source_changes('toy', full=True) == []
    a.write_text('ALPHA\n')
    assert source_changes('toy', full=True) == ["toy/a.txt changed (its sha256 differs from the fetched file's)"]
    a.unlink()
    assert source_changes('toy') == ['toy/a.txt is missing']


# --- 6. task files ---------------------------------------------------------------------------------------------------

def test_a_task_file_with_too_few_rows_names_the_minimum(tmp_path):
    from nl_embryo.tasks import task_from_file, MIN_TASK_ROWS
    pd.DataFrame({'text': ['good film', 'bad film'], 'label': [1, 0]}).to_csv(tmp_path/'two.csv', index=False)
    with pytest.raises(NlEmbryoError, match=r'2 usable row\(s\), split 2 train / 0 dev / 0 test: the dev and test split\(s\) would be empty') as e:
        task_from_file(tmp_path/'two.csv')
    assert f'at least {MIN_TASK_ROWS} rows' in e.value.fix
    pd.DataFrame({'text': [f't{i}' for i in range(MIN_TASK_ROWS)], 'label': [0, 1] * (MIN_TASK_ROWS // 2)}).to_csv(tmp_path/'ten.csv', index=False)
    assert min(task_from_file(tmp_path/'ten.csv').sizes.values()) >= 1


def test_a_non_utf8_task_file_says_save_it_as_utf8(tmp_path):
    from nl_embryo.tasks import task_from_file
    (tmp_path/'latin.csv').write_bytes('text,label\ncaf\xe9 cr\xe8me,1\nna\xefve,0\n'.encode('latin-1'))
    with pytest.raises(NlEmbryoError, match='is not UTF-8 text') as e: task_from_file(tmp_path/'latin.csv')
    assert 'save it as UTF-8' in e.value.fix


# --- 6. sweep grids ----------------------------------------------------------------------------------------------------

TOY = Path(__file__).parent/'fixtures'/'sweep_toy.ipynb'
EMBRYOLOGY = Path(__file__).parent.parent/'nbs'/'experiments'/'embryology.ipynb'


@pytest.mark.parametrize('grid, said', [({'x': ['one']}, "grid parameter x: 'one' is a string, but toy.ipynb's parameters cell sets x = 1 (a whole number)"),
                                        ({'fail': [1]}, "fail: 1 is a whole number, but toy.ipynb's parameters cell sets fail = False (a boolean)"),
                                        ({'y': [2]}, "y: 2 is a whole number, but toy.ipynb's parameters cell sets y = 'a' (a string)")])
def test_a_grid_value_of_the_wrong_type_stops_before_any_job(tmp_path, grid, said):
    from nl_embryo.batch import sweep
    toy = Path(shutil.copy(TOY, tmp_path/'toy.ipynb'))
    with pytest.raises(NlEmbryoError) as e: sweep(toy, grid, tmp_path/'out', quiet=True)
    assert said in str(e.value) and 'quote a value meant as text' in e.value.fix
    assert not (tmp_path/'out').exists()


def test_a_grid_that_turns_every_analysis_off_stops_before_any_job(tmp_path):
    from nl_embryo.batch import sweep, load_grid
    grid = load_grid("seed: [0, 1]\nprobe_tasks: [[]]\nattention_sentences: 0\nfinetune_tasks: [[]]\n")
    with pytest.raises(NlEmbryoError, match=r'job .*every analysis is off') as e: sweep(EMBRYOLOGY, grid, tmp_path/'out', quiet=True)
    assert 'turn at least one on' in e.value.fix and not (tmp_path/'out').exists()
    with pytest.raises(NlEmbryoError, match="seed: 'one' is a string"): sweep(EMBRYOLOGY, {'seed': ['one']}, tmp_path/'out', quiet=True)


def test_results_carry_status_and_error(tmp_path):
    from nl_embryo.batch import sweep
    toy = Path(shutil.copy(TOY, tmp_path/'toy.ipynb'))
    res = sweep(toy, {'jobs': [{'x': 2}, {'x': 4, 'fail': True}]}, tmp_path/'out', workers=1, quiet=True)
    df = pd.read_parquet(tmp_path/'out'/'results.parquet')
    assert {'status', 'error'} <= set(df.columns)
    failed = df[df['status'] == 'failed']
    assert len(failed) == 1 and 'asked to fail (x=4)' in failed['error'].iloc[0]
    assert df.loc[df['status'] == 'done', 'error'].isna().all() and not res.ok


@pytest.fixture
def small_disk(tmp_path):
    "A tmpfs of 40 MB (one checkpoint of the mini model fits, two do not); skipped where mounting is not permitted."
    import subprocess
    d = tmp_path/'disk'; d.mkdir()
    r = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=40m', 'tmpfs', str(d)], capture_output=True, text=True)
    if r.returncode != 0: pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or r.returncode}); the monkeypatched full-disk tests stand in")
    try: yield d
    finally: subprocess.run(['umount', str(d)], check=False)


def test_a_real_full_disk(small_disk, small_corpus):
    run = small_disk/'run'
    with pytest.raises(NlEmbryoError, match=r'the disk is full: (checkpoint step\d+|the metrics)') as e: train(run, steps=4)
    assert '--resume' in e.value.fix
    good = list(list_checkpoints(run))
    assert good and good[0] == 0 and all(checkpoint_problem(run/'checkpoints'/f'step{s}', full=True) is None for s in good)
    assert not [p for p in (run/'checkpoints').iterdir() if p.name.startswith('.')]     # the partial folder is gone


def test_metrics_are_rewritten_atomically_on_resume(tmp_path, reference, monkeypatch):
    run = tmp_path/'run'; shutil.copytree(reference, run)
    written = []
    real = P.atomic_write_text
    monkeypatch.setattr(P, 'atomic_write_text', lambda path, text: written.append(Path(path).name) or real(path, text))
    train(run, steps=6, checkpoints='0,2,4,6', resume=True)
    assert 'metrics.jsonl' in written
    assert [json.loads(l)['step'] for l in (run/'metrics.jsonl').read_text().splitlines()] == list(range(7))


def test_eval_split_bench_names_a_folder_that_is_not_a_run(tmp_path, reference):
    "bench/eval_split.py on a missing folder and on a bare checkpoint folder: one line each, naming the fix."
    import subprocess, sys
    root = Path(__file__).resolve().parent.parent
    for path, said in [(tmp_path/'nope', 'pass a run folder'), (Path(reference)/'checkpoints'/'step4', 'give a run folder')]:
        p = subprocess.run([sys.executable, str(root/'bench'/'eval_split.py'), str(path)], capture_output=True, text=True)
        assert p.returncode == 1 and said in p.stderr and 'Traceback' not in p.stderr, p.stderr
    p = subprocess.run([sys.executable, str(root/'bench'/'eval_split.py'), str(reference)], capture_output=True, text=True)
    row = p.stdout.strip().splitlines()[-1].split()
    assert p.returncode == 0 and row[1] == '4' and len(row) == 6, p.stdout + p.stderr   # a real run is scored both ways
