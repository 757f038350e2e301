"""`nl-embryo analyze` and `nl-embryo sweep` end to end: the four analyses through `main` in this process (test_demo.py
runs them through the console script), the rest through the console script (subprocesses, as a user runs them);
bad `analyze --steps` named by `main` in this process (on the shared `reference` run of conftest.py); bad input to
`pretrain`, `analyze`, `sweep` and `convert_to_safetensors` stopped with the problem and the fix, losing nothing."""
import os, shutil, subprocess
from pathlib import Path

import pandas as pd
import pytest

from conftest import ROOT, cli, nl_embryo_cmd

FIXTURES = ROOT/"tests"/"fixtures"


def run_cli(*args, check=True, timeout=600):
    r = subprocess.run(nl_embryo_cmd(*args), capture_output=True, text=True, timeout=timeout)
    if check: assert r.returncode == 0, f"nl-embryo {' '.join(map(str, args))} failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope='module')
def tiny_run(tmp_path_factory, small_corpus):
    "A mini BERT pre-trained for 4 steps on the small nested-zipf corpus, checkpoints at steps 0 and 4."
    from nl_embryo.pretrain import PretrainConfig, pretrain
    out = tmp_path_factory.mktemp('cli')/'run'
    return pretrain(PretrainConfig(out=str(out), arch='bert', preset='mini', corpus='nested-zipf', block_size=32,
                                   steps=4, batch_size=4, checkpoints='0,4', corpus_tokens=40_000), quiet=True)


def test_analyze_writes_every_table(tiny_run, capsys):
    rc, said = cli(capsys, 'analyze', tiny_run, '--probes', 'pos', '--reconstruction', '--attention', '--knowledge', '--quiet')
    assert rc == 0, said[-3000:]
    for name in ('probes', 'reconstruction', 'attention', 'knowledge'):
        path = tiny_run/'analysis'/f'{name}.parquet'
        assert path.exists(), f"{name}.parquet missing; output:\n{said}"
        df = pd.read_parquet(path)
        assert len(df) > 0 and set(df['step']) == {0, 4}, (name, sorted(set(df['step'])))
        assert f"{name}:" in said
    probes = pd.read_parquet(tiny_run/'analysis'/'probes.parquet')
    assert {'layer', 'task', 'metric', 'value'} <= set(probes.columns)
    assert set(probes['layer']) == set(range(5))          # embeddings + 4 layers of the mini preset
    attention = pd.read_parquet(tiny_run/'analysis'/'attention.parquet')
    assert {'layer', 'head', 'pattern', 'value'} <= set(attention.columns)


def test_analyze_only_some_steps_keeps_the_others(tiny_run, capsys):
    before = pd.read_parquet(tiny_run/'analysis'/'attention.parquet')
    rc, said = cli(capsys, 'analyze', tiny_run, '--attention', '--steps', '4', '--quiet')     # in this process (`main`)
    assert rc == 0, said[-2000:]
    df = pd.read_parquet(tiny_run/'analysis'/'attention.parquet')
    assert set(df['step']) == {0, 4} and len(df) == len(before)          # step 4 recomputed (from the cache), step 0 kept


def test_analyze_bad_input(tmp_path, capsys, tiny_run):
    # in this process (`main`, what the console script calls): a new interpreter per error would add only its start
    rc, err = cli(capsys, 'analyze', tmp_path/'no-such-run', '--attention')
    assert rc == 2 and 'no-such-run' in err and 'fix:' in err and 'Traceback' not in err
    rc, err = cli(capsys, 'analyze', tiny_run, '--attention', '--steps', '5')
    assert rc == 2 and 'no checkpoint at step 5' in err and 'Traceback' not in err


def test_analyze_bad_steps(tmp_path, capsys, reference):
    rc, err = cli(capsys, 'analyze', reference, '--steps', '0,abc')
    assert rc == 2 and "--steps '0,abc' is not a list of step numbers" in err and 'fix:' in err
    rc, err = cli(capsys, 'analyze', reference, '--steps', '0,3')
    assert rc == 2 and 'no checkpoint at step 3' in err


def test_sweep_command_needs_a_grid(tmp_path):
    r = run_cli('sweep', '--out', tmp_path/'s', check=False)
    assert r.returncode == 2 and '--grid' in r.stderr and 'Traceback' not in r.stderr


def _help(*args):
    import contextlib, io
    from nl_embryo.cli import main
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.raises(SystemExit) as e: main([*args, '--help'])
    assert e.value.code == 0
    return buf.getvalue()


def test_every_command_explains_itself():
    "Every option of every command has a help line; options with a fixed set of values list it."
    from nl_embryo.cli import _all_parsers, make_parser
    for parser in _all_parsers(make_parser()):
        assert parser.allow_abbrev is False, parser.prog
        for action in parser._actions:
            if action.option_strings and action.help is None: raise AssertionError(f"{parser.prog} {action.option_strings[0]} has no help")
    text = ' '.join(_help('pretrain').split())
    for flag, values in [('--arch', 'bert,roberta,albert,electra,ale,script,gpt2,gpt-neox,llama'), ('--preset', 'mini,tiny,tiny2,small,base'),
                         ('--objective', 'mlm,electra,script,clm'), ('--precision', 'auto,fp32,bf16'), ('--norm', 'post,pre'), ('--position-init', 'random,sinusoidal')]:
        assert f'{flag} {{{values}}}' in text, flag
    assert 'english,brown,sotu,turkish' in text and 'peak learning rate' in text


def test_prefixes_are_refused_and_version_is_printed():
    import contextlib, io
    from nl_embryo import __version__
    from nl_embryo.cli import main
    err = io.StringIO()
    with contextlib.redirect_stderr(err): code = main(['pretrain', '--step', '5'])
    assert code == 2 and 'unrecognized argument(s): --step (did you mean --steps?); 5' in err.getvalue()   # not taken as --steps 5
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit): main(['--version'])
    assert out.getvalue().strip() == f'nl_embryo {__version__}'


def test_objective_alone_implies_its_architecture(monkeypatch, capsys):
    "`--objective electra` with no `--arch` trains an ELECTRA (and says so) instead of refusing a BERT with ELECTRA's objective."
    import nl_embryo.pretrain as P
    from nl_embryo.cli import main
    seen = []
    monkeypatch.setattr(P, 'pretrain', lambda cfg, resume=False, quiet=False: seen.append(cfg) or cfg.out)
    assert main(['pretrain', '--objective', 'electra', '--out', 'x']) == 0
    assert seen[-1].arch == 'electra' and seen[-1].objective == 'electra'
    assert 'using --arch electra' in capsys.readouterr().out
    assert main(['pretrain', '--objective', 'mlm', '--arch', 'roberta', '--out', 'x', '--quiet']) == 0
    assert seen[-1].arch == 'roberta'                         # an explicit --arch is kept


# Bad input stops with a message naming the problem and the fix (exit status 2, no traceback), before any work and
# with nothing already written lost. Validation happens before training, so most of these train nothing.
TINY = ('--corpus', 'nested-zipf', '--preset', 'mini', '--block-size', 32, '--corpus-tokens', 40_000, '--batch-size', 8,
        '--steps', 2, '--checkpoints', '0,2', '--eval-batches', 1, '--quiet')


def refused(rc, out, *said):
    "An NlEmbryoError as the CLI prints it: status 2, a fix line, no traceback, and every phrase of `said` in the message."
    assert rc == 2 and 'nl-embryo: error:' in out and 'fix:' in out and 'Traceback' not in out, out
    for s in said: assert s in out, (s, out)


def deny_writes(monkeypatch, folder):
    "Make the probe files created under `folder` fail as the kernel fails a user's write there (root writes through permission bits)."
    import errno, tempfile
    real = tempfile.mkstemp
    def mkstemp(*a, dir=None, **k):
        if dir is not None and str(Path(dir)).startswith(str(folder)): raise PermissionError(errno.EACCES, 'Permission denied', str(dir))
        return real(*a, dir=dir, **k)
    monkeypatch.setattr(tempfile, 'mkstemp', mkstemp)


def test_pretrain_refuses_a_read_only_out_before_any_work(tmp_path, capsys, monkeypatch, small_corpus):
    ro = tmp_path/'ro'; ro.mkdir(); (ro/'kept.txt').write_text('kept'); ro.chmod(0o555)
    if os.geteuid() == 0: deny_writes(monkeypatch, ro)
    try: rc, out = cli(capsys, 'pretrain', *TINY, '--out', ro/'run')
    finally: ro.chmod(0o755)
    refused(rc, out, f"--out {ro/'run'} cannot be written: {ro} is read-only", 'choose a folder you can write to')
    assert [p.name for p in ro.iterdir()] == ['kept.txt']


def test_pretrain_refuses_an_unknown_device(tmp_path, capsys):
    refused(*cli(capsys, 'pretrain', *TINY, '--out', tmp_path/'run', '--device', 'foo'), "unknown device 'foo'", 'use --device cpu, cuda or cuda:N')
    assert not (tmp_path/'run').exists()


def test_pretrain_refuses_a_negative_vocabulary(tmp_path, capsys):
    refused(*cli(capsys, 'pretrain', *TINY, '--out', tmp_path/'run', '--vocab-size', -5), '--vocab-size -5 leaves no room', 'use e.g. --vocab-size 8000')
    assert not (tmp_path/'run').exists()


def test_analyze_refuses_a_run_without_checkpoints(tmp_path, capsys, reference):
    run = tmp_path/'run'; (run/'checkpoints').mkdir(parents=True)
    shutil.copy(reference/'config.json', run/'config.json')
    refused(*cli(capsys, 'analyze', run, '--attention', '--quiet'), f'{run} has no complete checkpoint', 'train the run first')
    assert sorted(p.name for p in run.iterdir()) == ['checkpoints', 'config.json']


def model_folder(path, vocab_size, tokenizer):
    "A model folder: a mini BERT of `vocab_size` embeddings saved with `tokenizer` (safetensors)."
    from nl_embryo.models import build_model
    build_model('bert', 'mini', vocab_size=vocab_size, max_position=64).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_analyze_refuses_a_tokenizer_past_the_vocabulary(tmp_path, capsys, english_tokenizer):
    folder = model_folder(tmp_path/'model', 100, english_tokenizer)
    refused(*cli(capsys, 'analyze', folder, '--attention', '--out', tmp_path/'analysis', '--quiet'),
            f'the tokenizer of {folder} has 8,000 tokens but the model only 100 embeddings', 'load the tokenizer the model was trained with')


def test_sweep_refuses_a_read_only_out(tmp_path, monkeypatch, capsys):
    grid = tmp_path/'grid.yaml'; grid.write_text('x: [1, 2]\n')
    ro = tmp_path/'ro'; ro.mkdir(); ro.chmod(0o555)
    if os.geteuid() == 0: deny_writes(monkeypatch, ro)
    try: rc, out = cli(capsys, 'sweep', FIXTURES/'sweep_toy.ipynb', '--grid', grid, '--out', ro/'sweep', '--quiet')
    finally: ro.chmod(0o755)
    refused(rc, out, f"--out {ro/'sweep'} cannot be written: {ro} is read-only", 'choose a folder you can write to')
    assert list(ro.iterdir()) == []


def test_a_config_of_the_wrong_types_is_refused(tmp_path):
    from nl_embryo.core import NlEmbryoError
    from nl_embryo.pretrain import PretrainConfig, pretrain
    for bad, said in [(dict(steps='10'), "option steps must be int, not str '10'"), (dict(lr='1e-3'), 'option lr must be a number (or None)'),
                      (dict(whole_word='yes'), 'option whole_word must be bool'), (dict(optimizer='sgd'), "unknown optimizer 'sgd'")]:
        with pytest.raises(NlEmbryoError) as e: pretrain(PretrainConfig(out=str(tmp_path/'run'), **bad), quiet=True)
        assert said in e.value.problem and e.value.fix, (bad, str(e.value))
    with pytest.raises(NlEmbryoError) as e: PretrainConfig(steps='10').resolved()
    assert 'pass steps=300' in e.value.fix and '--steps' in e.value.fix
    assert not (tmp_path/'run').exists()


@pytest.mark.parametrize('damage', ['a SETITEM with one value on the stack', 'a storage file missing', 'a pickle cut short'])
def test_convert_refuses_a_malformed_pickle(tmp_path, damage):
    import torch, zipfile
    from nl_embryo.core import NlEmbryoError
    from nl_embryo.models import convert_to_safetensors
    folder = tmp_path/'model'; folder.mkdir()
    torch.save({'w': torch.ones(2, 3)}, tmp_path/'good.bin')
    with zipfile.ZipFile(tmp_path/'good.bin') as z: entries = {n: z.read(n) for n in z.namelist()}
    pkl = next(n for n in entries if n.endswith('data.pkl'))
    if damage == 'a SETITEM with one value on the stack': entries[pkl] = b'\x80\x02}q\x00X\x01\x00\x00\x00ws.'
    elif damage == 'a storage file missing': entries = {n: b for n, b in entries.items() if '/data/' not in n}
    else: entries[pkl] = entries[pkl][:len(entries[pkl]) // 2]
    with zipfile.ZipFile(folder/'pytorch_model.bin', 'w') as z:
        for n, b in entries.items(): z.writestr(n, b)
    before = sorted(p.name for p in folder.iterdir())
    with pytest.raises(NlEmbryoError) as e: convert_to_safetensors(folder, out=tmp_path/'converted')
    assert 'pytorch_model.bin' in e.value.problem and ('not a well-formed torch.save checkpoint' in e.value.problem or 'not a plain torch state dict' in e.value.problem)
    assert e.value.fix and sorted(p.name for p in folder.iterdir()) == before and not (tmp_path/'converted').exists()


def test_a_full_disk_at_resume_is_named_and_loses_nothing(tmp_path, capsys, monkeypatch, reference):
    import errno
    import nl_embryo.pretrain as P
    run = tmp_path/'run'; shutil.copytree(reference, run)
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob('*') if p.is_file()}
    real = P.atomic_write_json
    def full(path, *a, **k):
        if Path(path).name == 'config.json': raise OSError(errno.ENOSPC, 'No space left on device', str(path))
        return real(path, *a, **k)
    monkeypatch.setattr(P, 'atomic_write_json', full)
    rc, out = cli(capsys, 'pretrain', '--corpus', 'nested-zipf', '--preset', 'mini', '--block-size', 32, '--corpus-tokens', 40_000,
                  '--batch-size', 8, '--lr', 2e-3, '--eval-batches', 1, '--steps', 4, '--checkpoints', '0,2,4', '--out', run, '--resume', '--quiet')
    refused(rc, out, f"the disk is full: {run/'config.json'} could not be written", 'free some space')
    assert {p.relative_to(run): p.read_bytes() for p in run.rglob('*') if p.is_file()} == before


def test_pretrain_refuses_cuda_without_a_gpu(tmp_path, capsys, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    refused(*cli(capsys, 'pretrain', *TINY, '--out', tmp_path/'run', '--device', 'cuda'), 'no CUDA device is available', 'use --device cpu')
    assert not (tmp_path/'run').exists()


def test_pretrain_refuses_zero_eval_batches(tmp_path, capsys):
    refused(*cli(capsys, 'pretrain', *TINY, '--out', tmp_path/'run', '--eval-batches', 0), '--eval-batches 0', 'at least 1 batch', '--eval-batches 4')
    assert not (tmp_path/'run').exists()


def test_pretrain_refuses_a_vocabulary_below_the_tokenizers_minimum(tmp_path, capsys, monkeypatch):
    "--vocab-size 10 used to give a 110-token tokenizer without a word; the minimum is named, and nothing is cached."
    import re
    import nl_embryo.corpora as C
    import nl_embryo.pretrain as P
    monkeypatch.setenv('NL_EMBRYO_DATA', str(tmp_path/'cache'))
    monkeypatch.setattr(P, 'fetch', lambda names, quiet=False: {})
    monkeypatch.setitem(C.TOKENIZERS, 'english', C.TokenizerSpec(lambda: ['the cat sat on the mat', 'a dog ran'] * 20, 'wordpiece', dict(lowercase=True)))
    rc, out = cli(capsys, 'pretrain', *TINY, '--out', tmp_path/'run', '--vocab-size', 10)
    refused(rc, out, '--vocab-size 10 is too small for the english tokenizer')
    need = int(re.search(r'alone take (\d+) pieces', out).group(1))
    assert need > 10 and f'use --vocab-size {need} or more' in out
    assert not C.tokenizer_dir('english', 10).exists() and not (tmp_path/'run').exists()


def test_pretrain_refuses_a_negative_temperature(tmp_path, capsys):
    refused(*cli(capsys, 'pretrain', *TINY, '--out', tmp_path/'run', '--arch', 'electra', '--temperature', -1),
            '--temperature -1.0 is not a sampling temperature', '--temperature 0.8')
    assert not (tmp_path/'run').exists()


def test_resume_of_a_missing_folder_is_refused(tmp_path, capsys):
    refused(*cli(capsys, 'pretrain', *TINY, '--out', tmp_path/'nothing', '--resume'),
            f"--resume: {tmp_path/'nothing'} does not exist, so there is no run to resume", 'drop --resume to start a new run')
    assert not (tmp_path/'nothing').exists()


def test_a_tokenizer_that_does_not_match_the_model_is_named(tmp_path, reference):
    "A run's checkpoint with another tokenizer is refused (check_tokenizer_matches); a model folder's much smaller one is warned about."
    import hashlib, json
    from nl_embryo.core import NlEmbryoError
    from nl_embryo.corpora import get_tokenizer
    from nl_embryo.timeline import Run
    small = get_tokenizer('protein')
    run = tmp_path/'run'; shutil.copytree(reference, run)
    ck = run/'checkpoints'/'step4'
    for p in ck.glob('tokenizer*'): p.unlink()
    small.save_pretrained(ck)
    files = {p.relative_to(ck).as_posix(): dict(size=p.stat().st_size, sha256=hashlib.sha256(p.read_bytes()).hexdigest())
             for p in sorted(ck.rglob('*')) if p.is_file() and p.name != 'manifest.json'}
    (ck/'manifest.json').write_text(json.dumps(dict(files=files)))        # a consistent checkpoint, with another tokenizer
    with pytest.raises(NlEmbryoError) as e: Run(run).load(4)
    assert f'has vocab_size=8000 but the tokenizer has {len(small)} tokens' in e.value.problem and 'the tokenizer the model was trained with' in e.value.fix
    folder = model_folder(tmp_path/'model', 8000, small)
    with pytest.warns(UserWarning, match=f'has {len(small)} tokens, the model 8,000'): Run(folder, out=tmp_path/'analysis').load()


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path, capsys):
    "Nine nested aliases of nine (a 378-byte grid of 9**9 values) kept a sweep at 100% CPU; they are refused before they expand."
    import signal
    bomb = 'a: &a [x, x, x, x, x, x, x, x, x]\n' + ''.join(f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip('abcdefgh', 'bcdefghi'))
    grid = tmp_path/'bomb.yaml'; grid.write_text(bomb)
    def hung(*_): raise TimeoutError('the alias bomb was not refused within 120 s')
    old = signal.signal(signal.SIGALRM, hung); signal.alarm(120)                 # a guard against the hang, not a timing check
    try: rc, out = cli(capsys, 'sweep', FIXTURES/'sweep_toy.ipynb', '--grid', grid, '--out', tmp_path/'sweep', '--quiet')
    finally: signal.alarm(0); signal.signal(signal.SIGALRM, old)
    refused(rc, out, "the grid's YAML aliases expand to more than 100,000 values", 'fix: write the values out')
    assert len(bomb.encode()) < 600 and not (tmp_path/'sweep').exists()


def test_a_mistyped_flag_or_value_is_one_line_with_a_suggestion(capsys):
    "`--attenton` and `--corpus englsh`: one error line naming the closest flag or value, no usage block; --surgery answers in its short names."
    from nl_embryo.cli import main
    assert main(['analyze', 'runs/none', '--attenton']) == 2
    err = capsys.readouterr().err
    assert 'did you mean --attention?' in err and 'usage:' not in err
    with pytest.raises(SystemExit) as e: main(['pretrain', '--corpus', 'englsh'])
    err = capsys.readouterr().err
    assert e.value.code == 2 and 'did you mean english?' in err and 'usage:' not in err and len(err.splitlines()) == 2
    demo = str(Path(__file__).resolve().parents[1]/'nbs'/'data'/'demo')   # a run folder (its tables; the names are checked first)
    assert main(['analyze', demo, '--surgery', 'revers']) == 2
    assert 'did you mean reverse?' in capsys.readouterr().err


def test_pretrain_without_out_does_not_write_into_the_demo(tmp_path, monkeypatch):
    "No --out: the run goes to runs/ARCH-CORPUS, not into the demo's folder."
    import nl_embryo.pretrain as P
    from nl_embryo.cli import main
    seen = {}
    monkeypatch.setattr(P, 'pretrain', lambda cfg, **kw: seen.setdefault('out', cfg.out))
    monkeypatch.chdir(tmp_path)
    main(['pretrain', '--arch', 'roberta', '--corpus', 'nested-zipf', '--quiet'])
    assert seen['out'] == 'runs/roberta-nested-zipf'
    from nl_embryo.cli import make_parser
    sub = next(a for a in make_parser()._actions if a.dest == 'command').choices
    assert sub['demo'].description and sub['docs'].description


def test_your_own_text_is_a_corpus_that_every_process_knows(tmp_path, capsys, monkeypatch):
    "`corpus add` stores text files in the data cache; a new process lists the corpus, `pretrain --corpus` trains on it, `corpus remove` deletes it."
    import json, re
    monkeypatch.setenv('NL_EMBRYO_DATA', str(tmp_path/'cache'))          # the subprocesses inherit it
    letters = tmp_path/'letters'; letters.mkdir()
    for i in range(40):
        (letters/f'{i:02d}.txt').write_text(f"Dear friend number {i},\nthe harvest of year {1900 + i} was {'good' if i % 3 else 'poor'} and the river was {'high' if i % 2 else 'low'}.\n"
                                            f"We sold {i * 7} sacks of grain at the market of the town, and bought a cow.\nYours truly, the farmer.\n")
    rc, said = cli(capsys, 'corpus', 'add', 'letters', letters, '--description', 'forty letters')
    assert rc == 0 and "corpus 'letters' stored: forty letters" in said and 'nl-embryo pretrain --corpus letters' in said, said
    assert 'split by document: 32 train, 8 eval (never trained on)' in said, said
    listed = run_cli('corpus', 'list').stdout                             # a new process finds it in the data cache
    assert re.search(r'letters +letters +real +by document +False +forty letters', listed), listed
    rc, said = cli(capsys, 'pretrain', '--corpus', 'letters', '--out', tmp_path/'run', '--preset', 'mini', '--block-size', 32, '--batch-size', 4,
                   '--steps', 2, '--checkpoints', '0,2', '--eval-batches', 1, '--quiet')
    assert rc == 0, said[-2000:]
    header = json.loads((tmp_path/'run'/'config.json').read_text())['corpus']
    assert (header['name'], header['tokenizer'], header['split']) == ('letters', 'letters', 'by document (split registry v1: letters)')
    refused(*cli(capsys, 'corpus', 'add', 'letters', letters), "corpus name 'letters' is taken by a stored text corpus", 'nl-embryo corpus remove letters')
    (tmp_path/'old.txt').write_bytes('café\n\nnaïve\n'.encode('latin-1'))
    refused(*cli(capsys, 'corpus', 'add', 'old', tmp_path/'old.txt'), 'old.txt is not UTF-8 text (byte 3 is 0xe9)', 'iconv -f latin1 -t utf-8')
    assert not (tmp_path/'cache'/'text'/'old').exists()
    rc, said = cli(capsys, 'corpus', 'remove', 'letters')
    assert rc == 0 and said.count('removed ') == 3 and not (tmp_path/'cache'/'text'/'letters').exists(), said
    assert 'letters' not in run_cli('corpus', 'list').stdout
    assert (tmp_path/'run'/'checkpoints'/'step2'/'tokenizer.json').exists()      # the run keeps its own tokenizer


def test_analyze_runs_what_can_run_and_names_each_refusal_in_one_line(tmp_path, capsys, reference):
    "A headless encoder (a BertModel, as MiniLM is published): reconstruction is refused in one line, attention and weights run; --strict stops."
    import shutil
    from nl_embryo.models import load_model, quiet_transformers
    ck = Path(reference)/'checkpoints'/'step4'
    enc = tmp_path/'encoder'
    with quiet_transformers(): load_model(ck).base_model.save_pretrained(enc)
    for f in ck.iterdir():
        if f.name.startswith(('tokenizer', 'special_tokens', 'vocab')): shutil.copy(f, enc/f.name)
    def run(*args):
        try: return cli(capsys, *args)
        except SystemExit as e:
            got = capsys.readouterr(); return e.code, got.out + got.err
    rc, said = run('analyze', enc, '--out', tmp_path/'a', '--reconstruction', '--attention', '--weights', '--quiet')
    assert rc in (0, None), said
    assert 'reconstruction: not run:' in said and 'without a masked-LM head' in said, said
    assert '2 of 3 analyses ran; not run: reconstruction' in said, said
    from nl_embryo.timeline import Run
    r = Run(enc, out=tmp_path/'a')
    assert r.has_table('attention') and r.has_table('weights') and not r.has_table('reconstruction')
    rc, said = run('analyze', enc, '--out', tmp_path/'b', '--reconstruction', '--attention', '--strict', '--quiet')
    assert rc == 2 and 'without a masked-LM head' in said and not Run(enc, out=tmp_path/'b').has_table('attention'), said
    rc, said = run('analyze', enc, '--out', tmp_path/'c', '--reconstruction', '--quiet')          # nothing could run
    assert rc == 2 and 'without a masked-LM head' in said, said


def test_tensorboard_export_of_a_run_reads_back_as_its_metrics(tiny_run, capsys):
    "`nl-embryo tensorboard RUN` writes RUN/tensorboard; TensorBoard's reader loads every scalar of metrics.jsonl; a second export is refused."
    import json
    import numpy as np
    from nl_embryo.dashboards import read_events, row_scalars
    rc, said = cli(capsys, 'tensorboard', tiny_run)
    assert rc == 0 and f"tensorboard --logdir {tiny_run/'tensorboard'}" in said, said
    ev = read_events(tiny_run/'tensorboard').set_index(['tag', 'step']).value
    rows = [json.loads(l) for l in (tiny_run/'metrics.jsonl').read_text().splitlines()]
    want = {(t, r['step']): v for r in rows for t, v in row_scalars(r).items()}
    assert set(ev.index) == set(want) and {t for t, _ in want} >= {'train/loss', 'eval/mlm_loss', 'eval/mlm_loss_lo', 'optim/lr', 'progress/tokens_per_s'}
    assert np.allclose([ev[k] for k in want], np.float32(list(want.values())), rtol=1e-6, atol=0)
    rc, said = cli(capsys, 'tensorboard', tiny_run)
    assert rc == 2 and 'already holds TensorBoard events' in said, said


@pytest.mark.parametrize('value, says', [('mlflow', 'choose none, tensorboard, wandb'), ('wandb', 'pip install wandb')])
def test_a_dashboard_it_cannot_write_is_refused_before_any_work(tmp_path, capsys, value, says):
    "--report-to with an unknown dashboard, or wandb where it is not installed: refused before the corpus or the model, nothing written."
    import importlib.util
    if value == 'wandb' and importlib.util.find_spec('wandb') is not None:
        value, says = 'wandb,neptune', 'choose none, tensorboard, wandb'      # installed here: the unknown name is refused instead
    rc, said = cli(capsys, 'pretrain', '--out', tmp_path/'r', '--report-to', value, '--corpus', 'nested-zipf', '--quiet')
    assert rc == 2 and says in said and '--report-to' in said, said
    assert not (tmp_path/'r').exists()


def test_every_help_ends_with_examples_that_parse():
    "Each sub-command's --help closes with examples of that very command, and each example parses."
    import shlex
    from nl_embryo.cli import _all_parsers, make_parser
    for parser in _all_parsers(make_parser()):
        text = parser.format_help()
        head, sep, examples = text.partition('\nexamples:\n')
        assert sep and examples.strip(), f"{parser.prog}: no examples in its help"
        cmd = parser.prog.removeprefix('nl-embryo').strip()
        for line in examples.strip().splitlines():
            argv = shlex.split(line.strip().split(' && ')[0])
            assert argv[0] == 'nl-embryo', line
            if argv[1:len(cmd.split()) + 1] == cmd.split():                # the command's own example: it parses
                make_parser(argv[1:]).parse_args(argv[1:])
            else: assert parser.prog == 'nl-embryo' or 'pretrain' in line, (parser.prog, line)   # the top and corpus add point onwards


def _import_seconds(*modules) -> float:
    "Wall seconds of a fresh interpreter importing `modules` (what a command pays before it can check anything)."
    import subprocess, sys, time
    t0 = time.perf_counter()
    subprocess.run([sys.executable, '-c', 'import ' + ', '.join(modules)], check=True)
    return time.perf_counter() - t0


def test_late_mistakes_are_refused_before_any_data_training_or_model_load(tiny_run, tmp_path, capsys, monkeypatch):
    "A surgery on a block the model lacks, a negative --analysis-steps, and a demo --out holding another run: refused before any load, faster than the imports."
    import time
    import nl_embryo.demo as demo
    from nl_embryo.timeline import Run
    def loaded(*a, **k): raise AssertionError('work started before the options were checked')
    for target, name in [(Run, 'load'), (Run, 'map_many'), (demo, 'pretrain'), (demo, 'fetch'), (demo, 'build_corpus'), (demo, 'run_analyses')]:
        monkeypatch.setattr(target, name, loaded)
    budget = _import_seconds('nl_embryo.analysis', 'nl_embryo.demo')
    for argv, says in [(['analyze', tiny_run, '--surgery', 'clean:block9', '--quiet'], 'the model has blocks block1..block'),
                       (['demo', '--out', tmp_path/'d', '--analysis-steps', '-1'], '--analysis-steps -1'),
                       (['demo', '--out', tiny_run], "holds a run that is not this demo's: it was trained with preset='mini'")]:
        t0 = time.perf_counter()
        rc, said = cli(capsys, *argv)
        took = time.perf_counter() - t0
        assert rc == 2 and says in said, (argv, said[-2000:])
        assert took < budget, f"{argv}: refused after {took:.1f} s, the imports take {budget:.1f} s"
    assert not (tmp_path/'d').exists()


def test_analyze_names_a_run_still_being_written_and_warns_in_one_line(tiny_run, tmp_path, capsys):
    "While pretrain holds a run's writer lock, analyze says so in one line of words and analyses the complete checkpoints."
    import shutil
    from nl_embryo.core import writer_lock
    run = tmp_path/'run'; shutil.copytree(tiny_run, run, ignore=shutil.ignore_patterns('analysis', 'tensorboard'))
    with writer_lock(run):
        rc, said = cli(capsys, 'analyze', run, '--weights', '--quiet')
    assert rc == 0, said[-2000:]
    line = next(l for l in said.splitlines() if 'still being written' in l)
    assert line.startswith('nl-embryo: warning: ') and 'its 2 complete checkpoint(s) are analysed' in line, line
    assert 'UserWarning' not in said and 'warnings.warn' not in said
    assert set(pd.read_parquet(run/'analysis'/'weights.parquet')['step']) == {0, 4}


def test_the_pretrain_progress_bar_shows_in_a_terminal_of_zero_columns(tmp_path):
    "A terminal that reports 0 columns still gets the progress bar (and the closing line)."
    import fcntl, pty, struct, termios, time
    m, s = pty.openpty()
    fcntl.ioctl(s, termios.TIOCSWINSZ, struct.pack('HHHH', 24, 0, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ('COLUMNS', 'LINES')}
    p = subprocess.Popen(nl_embryo_cmd('pretrain', '--out', tmp_path/'r', '--preset', 'mini', '--corpus', 'nested-zipf', '--corpus-tokens', '40000',
                                       '--block-size', '32', '--batch-size', '4', '--steps', '20', '--checkpoints', '0,20'),
                         stdin=s, stdout=s, stderr=s, env=env)
    os.close(s); out = b''
    while True:
        try: chunk = os.read(m, 65536)
        except OSError: break                 # the terminal closed: the process has ended
        if not chunk: break
        out += chunk
    assert p.wait(timeout=300) == 0, out[-2000:]
    text = out.decode(errors='replace')
    assert 'pretrain bert/mlm on nested-zipf' in text and '20/20' in text and 'run written to' in text, text[-2000:]
