"""Checkpoint faults injected on purpose (`nl_embryo.checkpoints`): the manifest written last, damaged checkpoints skipped,
named and resumed from the last good one, a changed byte found by the full check and refused by resume and analyses,
a lost manifest, `nl-embryo verify`, file modes under the umask, stale temporary files, the analysis cache of a copied
run, interrupted saves cleaned up on resume, and a full disk during a save (monkeypatched, and a real 40 MB tmpfs where
mounting is permitted). Each test copies the shared `reference` run (conftest.py) before it changes it, and takes seconds."""
import errno, json, shutil

import pandas as pd
import pytest
import torch

from conftest import MINI, train, weights
from nl_embryo.core import NlEmbryoError
from nl_embryo.pretrain import PretrainConfig, pretrain
from nl_embryo.checkpoints import list_checkpoints, checkpoint_problem, CHECKPOINT_MANIFEST
import nl_embryo.pretrain as P


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread): yield


def same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# --- damaged checkpoints ------------------------------------------------------------------------------------------

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
    with pytest.warns(UserWarning, match=r'writes checkpoint\(s\) step4 again .*continues from step2'):
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


# --- changed bytes, lost manifests, file modes, stale temporary files, copied runs ---------------------------------

def _toy(calls):
    "A toy analysis that counts its per-checkpoint computations in `calls`."
    from nl_embryo.registry import Analysis
    def count(model, tokenizer, data): calls.append(1); return pd.DataFrame({'n': [sum(p.numel() for p in model.parameters())]})
    return Analysis('toy_count', 'Toy count', count, lambda run: [None])


def test_a_changed_byte_of_the_same_size_is_refused_by_resume_and_by_analyses(tmp_path, reference):
    from nl_embryo.timeline import Run
    from nl_embryo.registry import analyze
    run = tmp_path/'run'; shutil.copytree(reference, run)
    w = run/'checkpoints'/'step4'/'model.safetensors'
    with open(w, 'r+b') as f: f.seek(w.stat().st_size // 2); f.write(b'\x7f' * 64)      # 64 bytes overwritten, the size kept
    assert Run(run).steps() == [0, 2, 4]                                   # the cheap check cannot see it
    with pytest.raises(NlEmbryoError, match=r'checkpoint \S*step4 is damaged: model.safetensors changed after it was written') as e:
        train(run, steps=6, checkpoints='0,2,4,6', resume=True)
    assert f"remove {run/'checkpoints'/'step4'}" in e.value.fix and 'step2' in e.value.fix
    assert list(list_checkpoints(run)) == [0, 2, 4]                        # nothing was trained from it
    calls = []
    with pytest.raises(NlEmbryoError, match=r'checkpoint step4 of \S+ is damaged: model.safetensors changed after it was written') as e:
        analyze(run, _toy(calls), progress=False, charts=False)
    assert '--resume' in e.value.fix and not Run(run).has_table('toy_count')
    assert len(analyze(run, _toy(calls), steps=[0, 2], progress=False, charts=False)) == 2   # the good ones still load


def test_a_deleted_manifest_among_manifested_checkpoints_is_damage(tmp_path, reference):
    from nl_embryo.checkpoints import damaged_checkpoints
    from nl_embryo.timeline import Run
    run = tmp_path/'run'; shutil.copytree(reference, run)
    (run/'checkpoints'/'step4'/CHECKPOINT_MANIFEST).unlink()
    assert list(damaged_checkpoints(run)) == [4] and 'manifest.json is missing' in damaged_checkpoints(run)[4]
    assert Run(run).steps() == [0, 2]
    with pytest.raises(NlEmbryoError, match='step4 .* is damaged: manifest.json is missing'): Run(run).load(4)
    with pytest.warns(UserWarning, match=r'writes checkpoint\(s\) step4 again .*continues from step2'):
        pretrain(PretrainConfig(out=str(run), steps=4, checkpoints='0,2,4', **MINI), resume=True, quiet=True)   # step4 is trained again
    assert same_weights(weights(run, 4), weights(reference, 4)) and (run/'checkpoints'/'step4'/CHECKPOINT_MANIFEST).exists()


def test_verify_prints_every_checkpoint_and_exits_1_when_one_is_damaged(tmp_path, reference, capsys):
    from conftest import cli
    from nl_embryo.cli import main
    run = tmp_path/'run'; shutil.copytree(reference, run)
    rc, out = cli(capsys, 'verify', run)
    assert rc == 0 and '3 checkpoint(s) verify' in out
    w = run/'checkpoints'/'step2'/'optimizer.safetensors'
    b = bytearray(w.read_bytes()); b[-1] ^= 0xFF; w.write_bytes(bytes(b))
    with pytest.raises(SystemExit) as e: main(['verify', str(run)])
    out = capsys.readouterr().out
    assert e.value.code == 1 and 'optimizer.safetensors changed after it was written' in out and '1 of 3 checkpoint(s) damaged: step(s) 2' in out
    rc, out = cli(capsys, 'verify', tmp_path)
    assert rc == 2 and 'has no checkpoints/ folder' in out


@pytest.mark.parametrize('umask, mode', [(0o022, 0o644), (0o002, 0o664)])
def test_checkpoint_files_have_the_umask_permissions(tmp_path, small_corpus, umask, mode):
    import os
    old = os.umask(umask)
    try: run = train(tmp_path/'run', steps=1, checkpoints='0,1')
    finally: os.umask(old)
    files = [p for p in (run/'checkpoints').rglob('*') if p.is_file()]
    assert {'model.safetensors', 'optimizer.safetensors', CHECKPOINT_MANIFEST} <= {p.name for p in files}
    assert {p.relative_to(run).as_posix(): oct(p.stat().st_mode & 0o777) for p in files if p.stat().st_mode & 0o777 != mode} == {}


def test_stale_temporary_files_are_removed_when_the_analysis_cache_is_opened(tmp_path, reference):
    import os, time
    from nl_embryo.timeline import Run
    run = tmp_path/'run'; shutil.copytree(reference, run)
    cache = run/'analysis'/'cache'/'count-0123456789abcdef'; cache.mkdir(parents=True)
    stale, live = cache/'.step0-0123.parquet.tmp-0123abcd', cache/'.step2-4567.parquet.tmp-4567cdef'
    stale.write_bytes(b'half'); live.write_bytes(b'being written')
    os.utime(stale, (time.time() - 86_400,) * 2)                            # a write killed yesterday
    Run(run).map(lambda m, t, d: pd.DataFrame({'x': [1]}), steps=[0], progress=False)
    assert not stale.exists() and live.exists()                            # a write of now is left alone


def test_a_copied_run_keeps_its_analysis_cache(tmp_path, reference):
    from nl_embryo.registry import analyze
    run = tmp_path/'run'; shutil.copytree(reference, run)
    calls = []
    analyze(run, _toy(calls), progress=False, charts=False)
    assert len(calls) == 3
    copy = tmp_path/'copy'; shutil.copytree(run, copy, copy_function=shutil.copy)      # new modification times, like cp -r
    w = 'checkpoints/step4/model.safetensors'
    assert (copy/w).stat().st_mtime_ns != (run/w).stat().st_mtime_ns
    first = analyze(copy, _toy(calls), progress=False, charts=False)
    assert len(calls) == 3 and list(first['step']) == [0, 2, 4]            # every step read from the copied cache


# --- a full disk ---------------------------------------------------------------------------------------------------

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
