"""Checkpoint timelines nl_embryo did not write, read where they are and never changed (`nl_embryo.sources`, `Run(path, out=)`):
a real transformers `Trainer` run, step folders of every naming, a hub cache whose snapshots are symlinks into blobs/, a
mapping file, pickles that must never be opened, a weight file changed after listing, two runs analysed together, and the
errors for an analysis folder inside the source and for a folder that is no timeline. Small BERTs (hidden 32, 2 layers)."""
import hashlib, json, os, pickle, shutil, stat, subprocess, warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import cli, nl_embryo_cmd
from nl_embryo.core import NlEmbryoError
from nl_embryo.sources import content_digest, parse_step_name, read_source, trainer_metrics
from nl_embryo.timeline import Run, default_analysis_home
from nl_embryo.charts import VEGA_MIME

PROBES = dict(n_words=300, progress=False, charts=False)          # small options: the analyses run, quickly
ATTENTION = dict(n_sentences=24, map_len=16, progress=False, charts=False)
RECONSTRUCTION = dict(per_group=12, seed=5, progress=False, charts=False)


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread): yield


def run_cli(*args, check=True, timeout=300):
    r = subprocess.run(nl_embryo_cmd(*args), capture_output=True, text=True, timeout=timeout)
    if check: assert r.returncode == 0, f"nl-embryo {' '.join(map(str, args))} failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r


def tree_digest(root) -> dict:
    "{relative path: sha256} of every file under `root` (symlinks followed), and every folder (as 'dir')."
    root, out = Path(root), {}
    for p in sorted(root.rglob('*')):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink(): out[rel] = 'link->' + os.readlink(p) + ':' + hashlib.sha256(p.read_bytes()).hexdigest()
        elif p.is_dir(): out[rel] = 'dir'
        else: out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def chmod_tree(root, writable: bool):
    "Make every folder and file under `root` read-only (or writable again)."
    for p in [Path(root), *Path(root).rglob('*')]:
        if p.is_symlink(): continue
        mode = p.stat().st_mode
        if writable: p.chmod(mode | stat.S_IWUSR)
        else: p.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def bert_config(tok):
    from transformers import BertConfig
    return BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                      max_position_embeddings=128, architectures=['BertForMaskedLM'])


def save_model(folder, tok, seed=0, tokenizer=True):
    "A freshly initialised small BertForMaskedLM (safetensors) with the English tokenizer, saved into `folder`."
    from transformers import BertForMaskedLM
    from nl_embryo.models import quiet_transformers
    torch.manual_seed(seed)
    with quiet_transformers(): BertForMaskedLM(bert_config(tok)).save_pretrained(folder)
    if tokenizer: tok.save_pretrained(folder)
    return Path(folder)


class OpensAFile:
    "A pickle payload: unpickling it calls open(marker, 'w'), i.e. creates the marker file."
    def __init__(self, marker): self.marker = str(marker)
    def __reduce__(self): return (open, (self.marker, 'w'))


# --- shared sources ------------------------------------------------------------------------------------------------

@pytest.fixture(scope='module')
def bank(tmp_path_factory, english_tokenizer):
    "Three small models (seeds 0, 1, 2), saved once and copied into the sources of the tests."
    root = tmp_path_factory.mktemp('bank')
    return {s: save_model(root/f'seed{s}', english_tokenizer, seed=s) for s in (0, 1, 2)}


SUITES = {   # suite folder -> [(folder name, step, tokens)], one naming each (names of different kinds could clash)
    'plain': [('step0', 0, None), ('step10', 10, None)],
    'underscore': [('step_0', 0, None), ('step_10', 10, None)],
    'dash': [('step-0', 0, None), ('step-10', 10, None)],
    'global': [('global_step100', 100, None), ('global_step200', 200, None)],
    'ckpt': [('checkpoint-500', 500, None), ('checkpoint-1000', 1000, None)],
    'kilo': [('step_20k', 20_000, None), ('step_40k', 40_000, None)],
    'olmo': [('step1000-tokens4B', 1000, 4 * 10**9), ('step2000-tokens8B', 2000, 8 * 10**9)],
    'multiberts': [('multiberts-seed_0-step_0', 0, None), ('multiberts-seed_0-step_20k', 20_000, None)],
}


@pytest.fixture(scope='module')
def suites(tmp_path_factory, bank):
    "One folder of step folders per naming; each suite's second checkpoint is another model than its first."
    root = tmp_path_factory.mktemp('suites')
    for suite, entries in SUITES.items():
        for i, (name, _, _) in enumerate(entries): shutil.copytree(bank[i], root/suite/name)
    (root/'plain'/'README.md').write_text('not a checkpoint')            # files and other folders are ignored
    (root/'plain'/'logs').mkdir()
    return root


# --- 1. a real Trainer run -----------------------------------------------------------------------------------------

SENTENCES = ["The cat sat on the mat and looked at the birds outside.", "She walked to the market to buy fresh bread.",
             "They have been working on the new bridge for two years.", "A small dog barked loudly at the passing car.",
             "We will meet again tomorrow morning at the old station.", "He reads a book every night before he sleeps.",
             "The children played in the garden until it got dark.", "My brother plays the guitar in a band."]


@pytest.fixture(scope='module')
def trainer_out(tmp_path_factory, english_tokenizer):
    "A transformers Trainer run of 6 steps (checkpoints 2, 4, 6; eval every 2) on a tiny MLM set; its output folder."
    from transformers import BertForMaskedLM, DataCollatorForLanguageModeling, Trainer, TrainingArguments
    from nl_embryo.models import quiet_transformers
    tok = english_tokenizer
    enc = [dict(tok(s, truncation=True, max_length=32)) for s in SENTENCES]
    train_set, eval_set = enc * 3, enc[:4]
    out = tmp_path_factory.mktemp('hf')/'trainer-run'
    torch.manual_seed(0)
    with quiet_transformers(): model = BertForMaskedLM(bert_config(tok))
    args = TrainingArguments(output_dir=str(out), max_steps=6, save_steps=2, logging_steps=1, eval_strategy='steps', eval_steps=2,
                             per_device_train_batch_size=4, per_device_eval_batch_size=4, report_to=[], use_cpu=True, seed=0,
                             disable_tqdm=True, dataloader_num_workers=0)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        trainer = Trainer(model=model, args=args, train_dataset=train_set, eval_dataset=eval_set, processing_class=tok,
                          data_collator=DataCollatorForLanguageModeling(tok, mlm_probability=0.3, seed=0) if _collator_takes_seed()
                          else DataCollatorForLanguageModeling(tok, mlm_probability=0.3))
        trainer.train()
    return out


def test_a_trainer_timeline_gets_the_model_intrinsic_analyses_and_stages(tmp_path, trainer_out):
    "ICL, similarity, essential dynamics and the LLC on a foreign timeline (its eval text named): read in place, tables in --out, a stage table."
    from nl_embryo.analysis import analyze
    before = tree_digest(trainer_out)
    run = Run(trainer_out, out=tmp_path/'A', eval_text='english')
    icl = analyze(run, 'icl', n_blocks=8, progress=False)
    s = icl[icl['metric'] == 'icl_score']
    assert set(s['step']) == {2, 4, 6} and ((s['lo'] <= s['value']) & (s['value'] <= s['hi'])).all() and set(icl['prediction']) == {'masked'}
    sim = analyze(run, 'similarity', n_blocks=8, n_tokens=128, n_boot=10, progress=False)
    last = sim[(sim['metric'] == 'cka_last') & (sim['step'] == 6)]
    assert np.allclose(last['value'], 1) and set(sim.loc[sim['metric'] == 'cka_previous', 'other_step']) == {2, 4}
    analyze(run, 'essential_dynamics', n_blocks=8, progress=False)
    ed = run.table('essential_dynamics')
    assert list(ed['step']) == [2, 4, 6] and ed['angle'].notna().sum() == 1 and (ed['n_tokens'] > 10).all()
    llc = analyze(run, 'llc', n_blocks=16, chains=2, draws=10, burnin=5, batch_size=4, progress=False)    # calibrated at step 6
    assert set(llc['step']) == {2, 4, 6} and (llc['calibrated_at'] == 6).all() and llc['lr'].nunique() == 1
    assert (run.home/'analysis'/'llc_calibration.csv').exists() and set(llc['status']) <= {'ok', 'not settled', 'diverged', 'not at a minimum'}
    assert set(run.stages()['kind']) <= {'onset', 'boundary'}
    assert tree_digest(trainer_out) == before

def _collator_takes_seed() -> bool:
    import inspect
    from transformers import DataCollatorForLanguageModeling
    return 'seed' in inspect.signature(DataCollatorForLanguageModeling.__init__).parameters


def test_trainer_output_is_read_in_place_and_never_changed(tmp_path, capsys, trainer_out):
    src = read_source(trainer_out)
    assert src.kind == 'trainer' and src.steps() == [2, 4, 6], src.table()
    assert src.trainer_state == trainer_out/'checkpoint-6'/'trainer_state.json'
    assert all(c.model_class == 'BertForMaskedLM' and c.tokenizer == c.path for c in src.checkpoints.values())
    # the Trainer's own pickles are there (and must stay unopened)
    assert (trainer_out/'checkpoint-2'/'training_args.bin').exists() and (trainer_out/'checkpoint-2'/'optimizer.pt').exists()
    home = default_analysis_home(trainer_out)                          # computed, not created
    assert trainer_out.resolve() not in home.resolve().parents and Run(trainer_out).home == home and not home.exists()
    before = tree_digest(trainer_out)
    out = tmp_path/'A'
    chmod_tree(trainer_out, writable=False)
    try:
        # the commands run in this process (`main`, what the console script calls; the other tests here start it)
        rc, said = cli(capsys, 'timeline', trainer_out, '--out', out)
        assert rc == 0 and 'trainer' in said and 'checkpoint-6' in said and str(out/'analysis') in said, said[-2000:]
        rec = json.loads((out/'source.json').read_text())
        assert rec['kind'] == 'trainer' and sorted(rec['digests'], key=int) == ['2', '4', '6']
        assert rec['digests']['4'] == content_digest(trainer_out/'checkpoint-4')
        rc, said = cli(capsys, 'analyze', trainer_out, '--out', out, '--probes', 'pos', '--attention', '--steps', '6', '--quiet')
        assert rc == 0 and 'probes:' in said and 'attention:' in said, said[-2000:]
        for name in ('probes', 'attention'):
            assert set(pd.read_parquet(out/'analysis'/f'{name}.parquet')['step']) == {6}, name
        run = Run(trainer_out, out=out)
        from nl_embryo.analysis import analyze
        probes = analyze(run, 'probes', **PROBES)
        attention = analyze(run, 'attention', **ATTENTION)
        assert sorted(set(probes['step'])) == sorted(set(attention['step'])) == [2, 4, 6]
        for name in ('probes', 'attention', 'attention_maps'):          # every table, every option set: the Trainer's steps only
            assert set(pd.read_parquet(out/'analysis'/f'{name}.parquet')['step']) <= {2, 4, 6}, name
        assert set(pd.read_parquet(out/'analysis'/'probes.parquet')['step']) == {2, 4, 6}
        assert tree_digest(trainer_out) == before                       # same files, same bytes
        m = run.metrics().set_index('step')
        hist = json.loads((trainer_out/'checkpoint-6'/'trainer_state.json').read_text())['log_history']
        losses = {h['step']: h['loss'] for h in hist if 'loss' in h}
        evals = {h['step']: h['eval_loss'] for h in hist if 'eval_loss' in h}
        assert sorted(losses) == [1, 2, 3, 4, 5, 6] and sorted(evals) == [2, 4, 6]
        assert all(m.loc[s, 'loss'] == pytest.approx(v) for s, v in losses.items())
        assert all(m.loc[s, 'eval_loss'] == pytest.approx(v) for s, v in evals.items())
        assert m['eval_loss'].dropna().index.tolist() == [2, 4, 6]
        assert trainer_metrics(run.source.trainer_state).equals(run.metrics())
    finally:
        chmod_tree(trainer_out, writable=True)
    assert tree_digest(trainer_out) == before


# --- 2. step folders of every naming -------------------------------------------------------------------------------

@pytest.mark.parametrize('suite', list(SUITES))
def test_step_folders_of_every_naming_are_listed(suites, suite):
    src = read_source(suites/suite)
    want = SUITES[suite]
    assert src.kind == 'step folders'                                   # checkpoint-N without trainer_state.json too
    assert src.steps() == [s for _, s, _ in want]
    assert [(c.step, c.tokens, c.path.name) for c in sorted(src.checkpoints.values(), key=lambda c: c.step)] == \
           [(s, t, n) for n, s, t in want]
    assert all(parse_step_name(n) == (s, t) for n, s, t in want)
    assert list(src.table()['step']) == [s for _, s, _ in want] and set(src.table()['weights']) == {'safetensors'}


def test_names_that_are_no_step_and_clashing_steps(tmp_path, bank):
    for name in ('seed_3', 'main', 'bestep12', 'README'): assert parse_step_name(name) is None, name
    clash = tmp_path/'clash'
    for name in ('step1000', 'step_1000'): shutil.copytree(bank[0], clash/name)
    with pytest.raises(NlEmbryoError, match='two folders for step 1000') as e: read_source(clash)
    assert 'mapping file' in e.value.fix


def test_a_suite_analysed_end_to_end(tmp_path, suites):
    from nl_embryo.analysis import analyze
    suite = suites/'plain'
    before = tree_digest(suite)
    run = Run(suite, out=tmp_path/'A')
    assert run.steps() == [0, 10] and run.home == tmp_path/'A'
    for name, opts in (('probes', PROBES), ('attention', ATTENTION), ('reconstruction', RECONSTRUCTION)):
        df = analyze(run, name, **opts)
        assert len(df) and sorted(set(df['step'])) == [0, 10], name
        assert set(pd.read_parquet(tmp_path/'A'/'analysis'/f'{name}.parquet')['step']) == {0, 10}, name
    assert {'layer', 'task', 'metric', 'value'} <= set(run.table('probes').columns)
    assert set(run.table('probes')['layer']) == {0, 1, 2}                # embeddings + 2 layers
    assert tree_digest(suite) == before and not (suite/'analysis').exists()
    assert run.metrics().empty                                          # step folders record no training metrics


def test_a_half_precision_suite_is_analysed_in_float32(tmp_path, bank, english_tokenizer):
    # Pythia's checkpoints are stored in float16: on a CPU the analyses run under bf16 autocast, where a float16 layer norm
    # stopped the probes with "mixed dtype (CPU)"; the one loader widens the weights to float32
    from transformers import BertForMaskedLM
    from nl_embryo.analysis import analyze
    from nl_embryo.models import quiet_transformers
    suite = tmp_path/'pythia-like'
    for step, seed in ((0, 0), (1000, 1)):
        with quiet_transformers(): BertForMaskedLM.from_pretrained(bank[seed]).half().save_pretrained(suite/f'step{step}')
        english_tokenizer.save_pretrained(suite/f'step{step}')
    assert json.loads((suite/'step0'/'config.json').read_text())['dtype'] == 'float16'
    run = Run(suite, out=tmp_path/'A')
    model, _ = run.load(1000)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    df = analyze(run, 'probes', **PROBES)
    assert sorted(set(df['step'])) == [0, 1000] and df['value'].notna().all()


# --- 3. a hub cache ------------------------------------------------------------------------------------------------

def make_hub_cache(root, bank) -> Path:
    "`models--org--tiny/` as huggingface_hub writes it: refs/<revision> -> commit, snapshots/<commit>/<file> -> ../../blobs/<sha256>."
    repo = root/'models--org--tiny'
    (repo/'blobs').mkdir(parents=True); (repo/'refs').mkdir()
    commits = {}
    for rev, seed in (('step0', 0), ('step1000', 1)):
        commit = hashlib.sha1(rev.encode()).hexdigest()
        snap = repo/'snapshots'/commit; snap.mkdir(parents=True)
        for f in sorted(bank[seed].iterdir()):
            data = f.read_bytes(); blob = hashlib.sha256(data).hexdigest()
            if not (repo/'blobs'/blob).exists(): (repo/'blobs'/blob).write_bytes(data)
            (snap/f.name).symlink_to(Path('..')/'..'/'blobs'/blob)
        (repo/'refs'/rev).write_text(commit)
        commits[rev] = commit
    (repo/'refs'/'main').write_text(commits['step1000'])
    return repo


def test_hub_cache_read_offline(tmp_path, bank, monkeypatch):
    from nl_embryo.analysis import analyze
    monkeypatch.setenv('HF_HUB_OFFLINE', '1'); monkeypatch.setenv('TRANSFORMERS_OFFLINE', '1')
    hub = make_hub_cache(tmp_path/'hub', bank)
    snap = hub/'snapshots'/hashlib.sha1(b'step0').hexdigest()
    assert (snap/'model.safetensors').is_symlink() and (snap/'model.safetensors').resolve().parent == (hub/'blobs').resolve()
    before = tree_digest(hub)
    src = read_source(hub)
    assert src.kind == 'hub cache' and src.steps() == [0, 1000]
    assert any("'main'" in n for n in src.notes)
    assert src.checkpoints[0].path == snap
    assert content_digest(src.checkpoints[0].path) != content_digest(src.checkpoints[1000].path)   # through the links
    run = Run(hub, out=tmp_path/'A')
    df = analyze(run, 'probes', **PROBES)
    assert sorted(set(df['step'])) == [0, 1000]
    assert tree_digest(hub) == before and sorted(p.name for p in hub.iterdir()) == ['blobs', 'refs', 'snapshots']


# --- 4. a mapping file ---------------------------------------------------------------------------------------------

def test_mapping_file_gives_the_steps(tmp_path, suites):
    m = suites/'map.csv'
    m.write_text('step,path,tokens\n5,plain/step10,10240\n9,kilo/step_20k,\n')
    try:
        src = read_source(m)
        assert src.kind == 'mapping' and src.steps() == [5, 9]
        assert src.checkpoints[5].path == suites/'plain'/'step10' and src.checkpoints[5].tokens == 10240
        assert src.checkpoints[9].path == suites/'kilo'/'step_20k' and src.checkpoints[9].tokens is None
        run = Run(m, out=tmp_path/'A')
        assert run.steps() == [5, 9]
        model, tok = run.load(9)
        assert type(model).__name__ == 'BertForMaskedLM' and len(tok) == model.config.vocab_size
        assert json.loads((tmp_path/'A'/'source.json').read_text())['digests'] == {'9': content_digest(suites/'kilo'/'step_20k')}
        bad = tmp_path/'bad.csv'; bad.write_text('step,path\n5,nowhere\n')
        with pytest.raises(NlEmbryoError, match='do not exist'): read_source(bad)
    finally:
        m.unlink()


# --- 5. pickles are never opened -----------------------------------------------------------------------------------

def test_pickles_in_the_source_are_never_unpickled(tmp_path, bank, english_tokenizer):
    from nl_embryo.analysis import analyze
    from nl_embryo.models import convert_to_safetensors, load_model
    marker = tmp_path/'UNPICKLED'
    payload = pickle.dumps(OpensAFile(marker), protocol=2)
    proof = tmp_path/'proof'
    pickle.loads(pickle.dumps(OpensAFile(proof), protocol=2))            # the payload works when unpickled
    assert proof.exists()
    src = tmp_path/'trainer'
    history = []
    for n, seed in ((2, 0), (4, 1)):
        ck = src/f'checkpoint-{n}'; shutil.copytree(bank[seed], ck)
        for f in ('optimizer.pt', 'rng_state.pth', 'training_args.bin', 'pytorch_model.bin'): (ck/f).write_bytes(payload)
        history += [dict(step=n, loss=5.0 - n / 4, learning_rate=1e-3), dict(step=n, eval_loss=5.5 - n / 4)]
        (ck/'trainer_state.json').write_text(json.dumps(dict(global_step=n, log_history=list(history))))
    # a checkpoint with pickled weights only: a real torch.save state dict
    from transformers import BertForMaskedLM
    from nl_embryo.models import quiet_transformers
    only = src/'checkpoint-6'; only.mkdir()
    torch.manual_seed(6)
    with quiet_transformers(): m6 = BertForMaskedLM(bert_config(english_tokenizer))
    m6.config.save_pretrained(only)
    sd = {k: v.clone() for k, v in m6.state_dict().items()}
    torch.save(sd, only/'pytorch_model.bin')
    (only/'optimizer.pt').write_bytes(payload)
    (only/'trainer_state.json').write_text(json.dumps(dict(global_step=6, log_history=history + [dict(step=6, loss=3.0)])))
    before = tree_digest(src)

    s = read_source(src)
    assert s.kind == 'trainer' and s.steps() == [2, 4] and sorted(s.checkpoints) == [2, 4, 6]
    c6 = s.checkpoints[6]
    assert c6.weights == 'pickle only' and not c6.usable and 'convert_to_safetensors' in c6.note
    assert s.table().set_index('step').loc[6, 'skipped'] == c6.note
    r = run_cli('timeline', src, '--out', tmp_path/'A')
    assert 'pickle only' in r.stdout and 'pickled weights only' in r.stdout
    run = Run(src, out=tmp_path/'A')
    assert run.steps() == [2, 4] and 6 in run.damaged()
    with pytest.raises(NlEmbryoError, match='cannot be loaded') as e: run.checkpoint(6)
    assert '2, 4' in e.value.fix
    df = analyze(run, 'probes', **PROBES)
    assert sorted(set(df['step'])) == [2, 4]                            # the pickle-only checkpoint is skipped
    assert list(run.metrics()['step']) == [2, 4, 6]                     # the metrics are read (JSON), all the same
    assert not marker.exists()

    conv = tmp_path/'converted'/'step6'
    written = convert_to_safetensors(only, out=conv)
    assert written == conv/'model.safetensors' and written.exists()
    assert not marker.exists() and tree_digest(src) == before           # nothing written into the source, nothing unpickled
    assert not (only/'model.safetensors').exists()
    assert (conv/'config.json').exists() and not list(conv.glob('*.bin')) and not list(conv.glob('*.pt'))
    loaded = load_model(conv).state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in sd.items() if k in loaded) and sum(k in loaded for k in sd) > 10
    cs = read_source(conv)
    assert cs.kind == 'model' and cs.steps() == [6]



def test_timeline_cli_shows_the_conversion_of_a_pickle_only_checkpoint(tmp_path, capsys, bank):
    shutil.copytree(bank[0], tmp_path/'suite'/'step0')
    only = tmp_path/'suite'/'step6'; shutil.copytree(bank[1], only)
    (only/'model.safetensors').unlink(); (only/'pytorch_model.bin').write_bytes(b'a pickle')
    assert read_source(only.parent).checkpoints[6].weights == 'pickle only'
    rc, text = cli(capsys, 'timeline', only.parent, '--out', tmp_path/'A')
    assert rc == 0 and 'pickle only' in text
    assert 'convert_to_safetensors' in text

# --- 6. a checkpoint changed after listing -------------------------------------------------------------------------

def test_weights_changed_after_listing_are_caught(tmp_path, capsys, bank):
    from nl_embryo.analysis import analyze
    src = tmp_path/'suite'
    for i, name in enumerate(('step0', 'step10')): shutil.copytree(bank[i], src/name)
    out = tmp_path/'A'
    run_cli('timeline', src, '--out', out)
    recorded = json.loads((out/'source.json').read_text())['digests']
    assert set(recorded) == {'0', '10'}
    run = Run(src, out=out)
    run.check_unchanged(10)                                             # unchanged: passes
    analyze(run, 'probes', steps=[10], **PROBES)
    w = src/'step10'/'model.safetensors'
    st, data = w.stat(), bytearray(w.read_bytes())
    data[-1] ^= 0x01                                                    # one byte, same size, same mtime
    w.write_bytes(bytes(data)); os.utime(w, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert w.stat().st_size == st.st_size and w.stat().st_mtime_ns == st.st_mtime_ns
    run = Run(src, out=out)
    with pytest.raises(NlEmbryoError, match='changed since it was listed'): run.check_unchanged(10)
    with pytest.raises(NlEmbryoError, match='changed since it was listed'): analyze(run, 'probes', steps=[10], **PROBES)
    with pytest.raises(NlEmbryoError, match='changed since it was listed'): analyze(run, 'probes', **PROBES)
    run.check_unchanged(0)                                              # the other checkpoint is fine
    rc, text = cli(capsys, 'analyze', src, '--out', out, '--attention', '--steps', '10', '--quiet')
    assert rc == 2 and 'changed since it was listed' in text and 'fix:' in text
    assert json.loads((out/'source.json').read_text())['digests'] == recorded   # the record is kept, not overwritten


# --- 7. two runs together ------------------------------------------------------------------------------------------

def test_two_runs_analysed_together(tmp_path, suites):
    from nl_embryo.registry import analyze_runs, runs_chart
    runs = {'a': Run(suites/'plain', out=tmp_path/'a'), 'b': Run(suites/'underscore', out=tmp_path/'b')}
    df = analyze_runs(runs, 'probes', **PROBES)
    assert df.columns[0] == 'run' and set(df['run']) == {'a', 'b'}
    assert all(sorted(set(df.loc[df['run'] == k, 'step'])) == [0, 10] for k in 'ab')
    assert (tmp_path/'a'/'analysis'/'probes.parquet').exists() and (tmp_path/'b'/'analysis'/'probes.parquet').exists()
    one = df[(df['task'] == df['task'].iloc[0]) & (df['metric'] == df['metric'].iloc[0]) & (df['layer'] == df['layer'].max())]
    assert len(one) == 4
    spec = runs_chart(one).to_dict()
    assert json.dumps(spec) and {'a', 'b'} <= {d['run'] for ds in spec.get('datasets', {}).values() for d in ds if 'run' in d}
    with pytest.raises(NlEmbryoError, match='run, step and value'): runs_chart(one.drop(columns='run'))


# --- 8. refusals ---------------------------------------------------------------------------------------------------

def test_out_inside_the_source_is_refused(tmp_path, capsys, suites):
    suite = suites/'dash'
    before = tree_digest(suite)
    for inside in (suite, suite/'analysis', suite/'step-0'/'x'):
        with pytest.raises(NlEmbryoError, match='inside') as e: Run(suite, out=inside)
        assert '--out' in e.value.fix
    m = tmp_path/'map.csv'; m.write_text(f'step,path\n1,{suite/"step-0"}\n')
    assert Run(m, out=tmp_path/'A').home == tmp_path/'A'                              # beside a mapping file: allowed
    with pytest.raises(NlEmbryoError, match='inside'): Run(m, out=suite/'step-0'/'A')  # inside a folder it lists: refused
    rc, text = cli(capsys, 'timeline', suite, '--out', suite/'analysis')
    assert rc == 2 and 'inside' in text and 'fix:' in text
    rc, text = cli(capsys, 'analyze', suite, '--out', suite/'out', '--attention')
    assert rc == 2 and 'inside' in text
    assert tree_digest(suite) == before


def test_a_folder_that_is_no_timeline_names_the_problem_and_the_fix(tmp_path, capsys):
    empty = tmp_path/'stuff'; empty.mkdir(); (empty/'notes.txt').write_text('hello'); (empty/'seed_3').mkdir()
    with pytest.raises(NlEmbryoError, match='holds no timeline') as e: read_source(empty)
    assert 'mapping file' in e.value.fix and 'config.json' in e.value.problem
    rc, text = cli(capsys, 'timeline', empty, '--out', tmp_path/'A')
    assert rc == 2 and 'holds no timeline' in text and 'fix:' in text
    assert not (tmp_path/'A').exists()
    with pytest.raises(NlEmbryoError, match='not a timeline'): read_source(empty/'notes.txt')


# --- 9. eval text named by the user ----------------------------------------------------------------------------------

def test_surgery_of_a_foreign_timeline_needs_an_eval_text_and_measures_the_one_named(tmp_path, capsys, suites, english_tokenizer):
    from collections import Counter
    import math
    from nl_embryo.analysis import analyze
    from nl_embryo.surgery import surgery_data
    from nl_embryo.timeline import unigram_entropy_of
    suite = suites/'plain'
    before = tree_digest(suite)
    rc, text = cli(capsys, 'analyze', suite, '--out', tmp_path/'A', '--surgery', '--quiet')
    assert rc == 2 and 'names no eval text' in text and '--eval-text english' in text and '--eval-text notes.txt' in text
    assert not (tmp_path/'A'/'analysis'/'surgery.parquet').exists()
    notes = tmp_path/'notes.txt'; notes.write_text('\n'.join(SENTENCES * 6) + '\n')
    run = Run(suite, out=tmp_path/'B', eval_text=notes)
    rec = json.loads((tmp_path/'B'/'eval_text.json').read_text())
    ids = [i for s in SENTENCES * 6 for i in english_tokenizer(s, add_special_tokens=False)['input_ids']]
    n, counts = len(ids), Counter(ids)
    assert rec['kind'] == 'text file' and rec['name'] == 'notes.txt' and rec['n_tokens'] == n and rec['n_texts'] == 48
    assert rec['unigram_entropy'] == pytest.approx(-sum(c / n * math.log(c / n) for c in counts.values()))
    assert unigram_entropy_of(Run(suite, out=tmp_path/'B')) == rec['unigram_entropy']           # read back from the folder
    data = surgery_data(run, probe=False, eval_batches=2, batch_size=2)[0]
    assert data['mask_id'] == english_tokenizer.mask_token_id and data['batches'][0].shape == (2, 128)
    assert list(data['batches'][0].ravel()) == ids[:256]                                           # the named text, its tokenizer, no special tokens
    df = analyze(run, 'surgery', surgeries='reverse', probe=False, eval_batches=2, batch_size=2, progress=False, charts=False)
    loss = df[(df['metric'] == 'mlm_loss') & (df['surgery'] == 'identity')]
    assert sorted(loss['step']) == [0, 10] and loss['value'].between(5, 15).all()                  # untrained: about log(vocabulary size)
    notes.write_text('other text\n')
    with pytest.raises(NlEmbryoError, match='changed since it was recorded'): surgery_data(Run(suite, out=tmp_path/'B'), probe=False)
    with pytest.raises(NlEmbryoError, match='no document split'): Run(suite, out=tmp_path/'C', eval_text='nested-zipf')
    assert tree_digest(suite) == before


def test_a_checkpoint_still_being_written_is_skipped_and_analysed_once_complete(tmp_path, capsys, trainer_out):
    "A newest checkpoint-8 as a Trainer leaves it mid-save: first its weights cut short, then whole but no trainer_state.json yet, then done."
    from nl_embryo.analysis import analyze
    run_dir = tmp_path/'run'
    shutil.copytree(trainer_out, run_dir)
    new = run_dir/'checkpoint-8'
    shutil.copytree(run_dir/'checkpoint-6', new, ignore=shutil.ignore_patterns('trainer_state.json'))
    full = (new/'model.safetensors').read_bytes()
    (new/'model.safetensors').write_bytes(full[:len(full) // 2])                 # the weights half written
    states = {}
    for stage in ('cut short', 'no trainer_state.json yet', 'complete'):
        if stage == 'no trainer_state.json yet': (new/'model.safetensors').write_bytes(full)
        if stage == 'complete': shutil.copy(run_dir/'checkpoint-6'/'trainer_state.json', new/'trainer_state.json')
        src = read_source(run_dir)
        states[stage] = src.checkpoints[8].weights
        rc, said = cli(capsys, 'analyze', run_dir, '--out', tmp_path/'A', '--probes', 'pos', '--quiet')
        assert rc == 0, said[-2000:]
        steps = sorted(set(pd.read_parquet(tmp_path/'A'/'analysis'/'probes.parquet')['step']))
        if stage != 'complete':
            assert src.steps() == [2, 4, 6] and steps == [2, 4, 6], (stage, src.table())
            assert stage in src.checkpoints[8].note, src.checkpoints[8].note
            rc, said = cli(capsys, 'timeline', run_dir, '--out', tmp_path/'A')
            assert rc == 0 and 'incomplete' in said and stage in said, said[-2000:]
        else: assert src.steps() == [2, 4, 6, 8] and steps == [2, 4, 6, 8]        # complete: analysed, the rest from the cache
    assert states == {'cut short': 'incomplete', 'no trainer_state.json yet': 'incomplete', 'complete': 'safetensors'}
    digests = json.loads((tmp_path/'A'/'source.json').read_text())['digests']
    assert digests['8'] == content_digest(new)                                   # the digest of the complete file, never of the cut one


def test_a_trainer_timeline_leaves_the_plateau_against_the_named_eval_text(tmp_path, capsys, trainer_out):
    from nl_embryo.timeline import unigram_entropy_of
    assert 'left the unigram plateau' not in set(Run(trainer_out, out=tmp_path/'none').phases()['phase'])   # no eval text named: no mark
    rc, text = cli(capsys, 'analyze', trainer_out, '--out', tmp_path/'A', '--surgery', 'reverse', '--eval-text', 'english', '--steps', '6', '--quiet')
    assert rc == 0 and 'eval text: english (corpus eval split)' in text, text[-2000:]
    rec = json.loads((tmp_path/'A'/'eval_text.json').read_text())
    assert rec['kind'] == 'corpus eval split' and rec['n_tokens'] > 100_000 and 4 < rec['unigram_entropy'] < 9
    assert set(pd.read_parquet(tmp_path/'A'/'analysis'/'surgery.parquet')['step']) == {6}
    run = Run(trainer_out, out=tmp_path/'A')
    assert unigram_entropy_of(run) == rec['unigram_entropy']
    ph = run.phases().set_index('phase').loc['left the unigram plateau']
    evals = run.metrics().dropna(subset=['eval_loss'])
    assert ph['reference'] == rec['unigram_entropy'] and ph['value'] in set(evals['eval_loss'])
    assert "'english'" in ph['detail'] and "Trainer's eval loss" in ph['detail'] and 'own eval set' in ph['detail']


# --- 10. the analysis folder stays small beside the checkpoints ------------------------------------------------------

def test_the_analysis_folder_is_a_small_fraction_of_the_checkpoints(tmp_path, english_tokenizer):
    from transformers import BertConfig, BertForMaskedLM
    from nl_embryo.analysis import analyze
    from nl_embryo.models import quiet_transformers
    suite = tmp_path/'suite'
    for i, step in enumerate((100, 200, 300)):                          # three BERTs of hidden 128: 6 MB each
        torch.manual_seed(i)
        cfg = BertConfig(vocab_size=len(english_tokenizer), hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=256, max_position_embeddings=128, architectures=['BertForMaskedLM'])
        with quiet_transformers(): BertForMaskedLM(cfg).save_pretrained(suite/f'step{step}')
        english_tokenizer.save_pretrained(suite/f'step{step}')
    run = Run(suite, out=tmp_path/'A')
    analyze(run, 'probes', **dict(PROBES, charts=True))
    analyze(run, 'attention', **dict(ATTENTION, charts=True))
    size = lambda root: sum(p.stat().st_size for p in Path(root).rglob('*') if p.is_file())
    pages = sorted((tmp_path/'A'/'analysis').glob('*.html'))
    assert len(pages) >= 5 and all('vega-embed' not in p.read_text()[:20_000] or 'src="vega-embed-' in p.read_text() for p in pages)
    js = list((tmp_path/'A'/'analysis').glob('vega-embed-*.js'))
    assert len(js) == 1 and all(f'src="{js[0].name}"' in p.read_text() for p in pages)            # one bundle, shared by every page
    assert size(tmp_path/'A') < 0.15 * size(suite), (size(tmp_path/'A'), size(suite))


# --- 11. a timeline without step 0 ---------------------------------------------------------------------------------

def test_charts_of_a_timeline_without_step_0_say_where_it_starts(tmp_path, suites):
    from nl_embryo.analysis import analyze
    from nl_embryo.registry import analysis_tables, get_analysis
    run = Run(suites/'kilo', out=tmp_path/'A')
    assert run.steps() == [20_000, 40_000]
    from nl_embryo.reconstruction import reconstruction_chart
    analyze(run, 'probes', **PROBES)
    analyze(run, 'reconstruction', **RECONSTRUCTION)
    charts = dict(get_analysis('probes').charts(analysis_tables(run, 'probes')), reconstruction=reconstruction_chart(run.table('reconstruction')))
    for cname, chart in charts.items():                                 # the charts over the shared step axis (a heatmap labels each cell)
        if 'heatmap' in cname: continue
        assert 'step (first checkpoint: step 20k; no step 0)' in json.dumps(chart.to_dict()), cname
    plain = Run(suites/'plain', out=tmp_path/'B')                        # a timeline from step 0: the plain title
    analyze(plain, 'probes', **PROBES)
    assert all('no step 0' not in json.dumps(c.to_dict()) for c in get_analysis('probes').charts(analysis_tables(plain, 'probes')).values())


# --- 12. the attention explorer over several runs ------------------------------------------------------------------

def test_attention_explorer_switches_between_runs(tmp_path, suites):
    from nl_embryo.analysis import analyze
    from nl_embryo.attention import AttentionExplorer
    runs = {'from0': Run(suites/'plain', out=tmp_path/'a'), 'late': Run(suites/'kilo', out=tmp_path/'b')}
    for r in runs.values(): analyze(r, 'attention', **ATTENTION)
    ex = AttentionExplorer.from_runs(runs, compute=False)
    assert ex.run is not None and list(ex.run.options) == ['from0', 'late'] and ex.run in ex.widget.children[1].children
    assert ex.steps == [0, 10] and ex.step.value == 10 and set(ex.maps['run']) == {'from0'}
    first, renders = ex.map_view.outputs, ex.renders                     # the map: a live Vega chart in an Output widget
    ex.layer.value, ex.head.value = 2, 2
    ex.run.value = 'late'                                                # the run selector reloads steps, maps and scores
    assert ex.steps == [20_000, 40_000] and list(ex.step.options) == [20_000, 40_000] and ex.step.value == 40_000
    assert set(ex.maps['run']) == {'late'} and set(ex.scores['run']) == {'late'} and (ex.layer.value, ex.head.value) == (2, 2)
    assert VEGA_MIME in ex.map_view.outputs[0]['data'] and ex.map_view.outputs != first and ex.renders > renders
    assert 'step 40000' in ex.table.value
    ex.run.value = 'from0'
    assert ex.steps == [0, 10] and ex.step.value == 10
    one = AttentionExplorer.from_run(runs['late'], compute=False)       # one run: no selector
    assert one.run is None and one.steps == [20_000, 40_000]


def test_a_trainer_timeline_gets_syntactic_heads_and_word_curves(tmp_path, trainer_out):
    "The word-by-word instruments on a foreign timeline: read in place, their tables in the --out folder, the source unchanged."
    from nl_embryo.analysis import analyze, report_section
    before = tree_digest(trainer_out)
    run = Run(trainer_out, out=tmp_path/'A')
    sh = analyze(run, 'syntax_heads', n_words=1500, min_pairs=10, progress=False)
    assert set(sh['step']) == {2, 4, 6} and {'det', 'prep', 'pobj'} <= set(sh['relation']) and sh['baseline'].notna().all()
    assert set(sh['direction']) == {'dependent→head', 'head→dependent'} and ((sh['lo'] <= sh['value']) & (sh['value'] <= sh['hi'])).all()
    assert (sh['offset'].abs() <= 10).all() and (sh['n'] >= 10).all()
    assert any(isinstance(p, str) and 'fixed offset' in p for p in report_section(run, 'syntax_heads').parts)
    curves = analyze(run, 'acquisition', max_words=20, n_contexts=4, progress=False)
    assert set(curves['step']) == {2, 4, 6} and set(curves['prediction']) == {'masked'}
    assert run.table('acquisition')['fit'].str.contains('at least 4').all()       # three checkpoints: no age, and the table says why
    from nl_embryo.minimal_pairs import with_step0
    mp = analyze(run, 'minimal_pairs', max_pairs=6, progress=False)                   # no step 0: an untrained twin is the step-0 baseline
    assert set(mp['step']) == {2, 4, 6} and mp['phenomenon'].nunique() == 6 and mp[['untrained', 'unigram']].notna().all().all()
    b = with_step0(mp)
    assert (b['step0'] == b['untrained']).all() and ((b['untrained_lo'] <= b['untrained']) & (b['untrained'] <= b['untrained_hi'])).all()
    assert tree_digest(trainer_out) == before


def test_a_trainer_runs_metrics_export_to_tensorboard_beside_it_never_into_it(tmp_path, capsys, monkeypatch, trainer_out):
    "`nl-embryo tensorboard` on a Trainer folder: the events go to ./tensorboard/NAME, equal its log_history, and nothing is written into it."
    from nl_embryo.dashboards import read_events
    before = tree_digest(trainer_out)
    monkeypatch.chdir(tmp_path)
    rc, said = cli(capsys, 'tensorboard', trainer_out)
    out = tmp_path/'tensorboard'/'trainer-run'
    assert rc == 0 and str(Path('tensorboard')/'trainer-run') in said, said
    ev = read_events(out).set_index(['tag', 'step']).value
    hist = json.loads((trainer_out/'checkpoint-6'/'trainer_state.json').read_text())['log_history']
    assert {s: round(v, 5) for (t, s), v in ev.items() if t == 'train/loss'} == {h['step']: round(h['loss'], 5) for h in hist if 'loss' in h}
    assert {s for (t, s) in ev.index if t == 'eval/loss'} == {2, 4, 6} and ('optim/lr', 1) in ev.index
    rc, said = cli(capsys, 'tensorboard', trainer_out)                  # events already there: not written over
    assert rc == 2 and 'already holds TensorBoard events' in said and '--out' in said, said
    rc, said = cli(capsys, 'tensorboard', trainer_out, '--out', trainer_out/'tb')
    assert rc == 2 and 'did not create' in said, said
    assert tree_digest(trainer_out) == before
