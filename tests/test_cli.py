"""`nl-embryo analyze` and `nl-embryo sweep` end to end through the console script (subprocesses, as a user runs them);
bad `analyze --steps` named by `main` in this process (on the shared `reference` run of conftest.py)."""
import subprocess

import pandas as pd
import pytest

from conftest import cli, nl_embryo_cmd


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


def test_analyze_writes_every_table(tiny_run):
    r = run_cli('analyze', tiny_run, '--probes', 'pos', '--reconstruction', '--attention', '--knowledge', '--quiet')
    for name in ('probes', 'reconstruction', 'attention', 'knowledge'):
        path = tiny_run/'analysis'/f'{name}.parquet'
        assert path.exists(), f"{name}.parquet missing; output:\n{r.stdout}"
        df = pd.read_parquet(path)
        assert len(df) > 0 and set(df['step']) == {0, 4}, (name, sorted(set(df['step'])))
        assert f"{name}:" in r.stdout
    probes = pd.read_parquet(tiny_run/'analysis'/'probes.parquet')
    assert {'layer', 'task', 'metric', 'value'} <= set(probes.columns)
    assert set(probes['layer']) == set(range(5))          # embeddings + 4 layers of the mini preset
    attention = pd.read_parquet(tiny_run/'analysis'/'attention.parquet')
    assert {'layer', 'head', 'pattern', 'value'} <= set(attention.columns)


def test_analyze_only_some_steps_keeps_the_others(tiny_run):
    before = pd.read_parquet(tiny_run/'analysis'/'attention.parquet')
    run_cli('analyze', tiny_run, '--attention', '--steps', '4', '--quiet')
    df = pd.read_parquet(tiny_run/'analysis'/'attention.parquet')
    assert set(df['step']) == {0, 4} and len(df) == len(before)          # step 4 recomputed (from the cache), step 0 kept


def test_analyze_bad_input(tmp_path, tiny_run):
    r = run_cli('analyze', tmp_path/'no-such-run', '--attention', check=False)
    assert r.returncode == 2 and 'no-such-run' in r.stderr and 'Traceback' not in r.stderr
    r = run_cli('analyze', tiny_run, '--attention', '--steps', '5', check=False)
    assert r.returncode == 2 and '5' in r.stderr and 'Traceback' not in r.stderr


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
    for flag, values in [('--arch', 'bert,roberta,albert,electra,ale,script'), ('--preset', 'mini,tiny,tiny2,small,base'),
                         ('--objective', 'mlm,electra,script'), ('--precision', 'auto,fp32,bf16'), ('--norm', 'post,pre'), ('--position-init', 'random,sinusoidal')]:
        assert f'{flag} {{{values}}}' in text, flag
    assert 'english,brown,sotu,turkish' in text and 'peak learning rate' in text


def test_prefixes_are_refused_and_version_is_printed():
    import contextlib, io
    from nl_embryo import __version__
    from nl_embryo.cli import main
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as e: main(['pretrain', '--step', '5'])
    assert e.value.code == 2 and 'unrecognized arguments: --step 5' in err.getvalue()      # not taken as --steps 5
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
