"""Checkpoint faults injected on purpose (`nl_embryo.checkpoints`): the manifest written last, damaged checkpoints skipped,
named and resumed from the last good one, a changed byte found by the full check, interrupted saves cleaned up on
resume, and a full disk during a save (monkeypatched, and a real 40 MB tmpfs where mounting is permitted). Each test
copies the shared `reference` run (conftest.py) before it changes it, and takes seconds."""
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
