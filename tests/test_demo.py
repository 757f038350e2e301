"""`nl-embryo demo` end to end through the console script: a short run, the four analyses on a log-spaced subset of
its checkpoints, the executed report; a second call resumes (no training step is repeated) and rewrites the report."""
import json
import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from conftest import cli, nl_embryo_cmd

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ['Training curves', 'Phases', 'Linear probes', 'Token reconstruction', 'Attention heads', 'World knowledge', 'Surgery over time',
            'age of acquisition', 'Syntactic heads', 'Minimal pairs', 'In-context learning', 'Representation similarity', 'Essential dynamics',
            'Stages']


def demo(out, *args):
    env = dict(os.environ, OMP_NUM_THREADS='1')
    r = subprocess.run(nl_embryo_cmd('demo', '--out', out, *args), capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, f"nl-embryo demo failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def test_demo_trains_measures_reports_and_resumes(tmp_path, capsys, monkeypatch, one_torch_thread):
    out = tmp_path/'demo'
    r = demo(out, '--steps', '8', '--analysis-steps', '3', '--preset', 'mini')      # mini: the analyses at the least cost
    ckpts = sorted(int(p.name[4:]) for p in (out/'checkpoints').iterdir() if p.name.startswith('step'))
    assert ckpts == [0, 1, 2, 4, 8]
    assert 'analyses at steps [0, 4, 8]' in r.stdout                                # spread evenly over the steps (DEMO_SPREAD)
    for name in ('probes', 'reconstruction', 'attention', 'knowledge', 'surgery', 'weights', 'syntax_heads', 'minimal_pairs', 'icl', 'similarity'):
        df = pd.read_parquet(out/'analysis'/f'{name}.parquet')
        assert set(df['step']) == {0, 4, 8}, (name, sorted(set(df['step'])))
        assert df['value'].notna().any()
    assert 'acquisition, essential_dynamics at all 5 checkpoints' in r.stdout                          # ages need the whole timeline: every checkpoint
    curves, ages = (pd.read_parquet(out/'analysis'/f'{t}.parquet') for t in ('acquisition_surprisal', 'acquisition'))
    assert set(curves['step']) == {0, 1, 2, 4, 8} and ages['word'].is_unique and ages['aoa'].notna().all()
    html = (out/'report.html').read_text()
    for heading in SECTIONS: assert heading in html, heading
    # the three checks are printed, shown in the report, and honest about an 8-step run: still on the plateau
    assert 'check [FAIL] left the unigram plateau' in r.stdout and 'Does the embryo grow?' in html
    from nl_embryo.demo import demo_checks
    checks = demo_checks(out).set_index('check')
    assert list(checks.index) == ['left the unigram plateau', 'mask prediction: function words first', 'POS probe beats step 0']
    assert checks.loc['left the unigram plateau', 'passed'] == False and checks['passed'].notna().all()   # noqa: E712
    assert 'Traceback' not in html and 'cdn.jsdelivr' not in html and html.count('<svg') >= 5
    nb = json.loads((out/'report.ipynb').read_text())
    assert not [o for c in nb['cells'] if c['cell_type'] == 'code' for o in c.get('outputs', []) if o.get('output_type') == 'error']
    assert sum("show_section(run, " in ''.join(c['source']) for c in nb['cells']) == 12         # one per analysis section with a table
    ed = pd.read_parquet(out/'analysis'/'essential_dynamics.parquet')                         # the output path over every checkpoint
    assert list(ed['step']) == [0, 1, 2, 4, 8] and not (out/'analysis'/'llc.parquet').exists()   # the LLC only on request
    assert any('parameters' in c['metadata'].get('tags', []) for c in nb['cells'])             # papermill's parameters cell

    steps_logged = [json.loads(l)['step'] for l in (out/'metrics.jsonl').read_text().splitlines()]
    mtime = (out/'report.html').stat().st_mtime_ns
    monkeypatch.setenv('OMP_NUM_THREADS', '1')                   # the report's kernel inherits it, as from the console script
    # the second call and `analyze` run in this process (`main`): the console script was exercised above, a new interpreter adds only its start
    rc, said = cli(capsys, 'demo', '--out', out, '--steps', '8', '--analysis-steps', '3', '--preset', 'mini')   # complete run: reused, caches read
    assert rc == 0, said[-3000:]
    assert [json.loads(l)['step'] for l in (out/'metrics.jsonl').read_text().splitlines()] == steps_logged
    assert (out/'report.html').stat().st_mtime_ns > mtime
    # the CLI's defaults are the demo's: `analyze --probes` finds the demo's cache (no new cache entry) and its table rows
    cache = sorted(p.name for p in (out/'analysis'/'cache').rglob('*.parquet'))
    rows = len(pd.read_parquet(out/'analysis'/'probes.parquet'))
    rc, said = cli(capsys, 'analyze', out, '--probes', '--steps', '0,4,8', '--quiet')
    assert rc == 0, said[-2000:]
    assert sorted(p.name for p in (out/'analysis'/'cache').rglob('*.parquet')) == cache
    assert len(pd.read_parquet(out/'analysis'/'probes.parquet')) == rows


def test_demo_without_analyses_reports_the_training_only(tmp_path):
    out = tmp_path/'demo'
    demo(out, '--steps', '2', '--no-analyses')                       # the default preset (tiny2)
    assert json.loads((out/'config.json').read_text())['config']['preset'] == 'tiny2'
    assert not (out/'analysis').exists() or not any((out/'analysis').glob('*.parquet'))
    html = (out/'report.html').read_text()
    assert 'Training curves' in html and 'Linear probes' not in html and 'World knowledge' not in html


@pytest.mark.parametrize('folder', ['demo', 'demo-seeds/seed1', 'demo-seeds/seed2'])
def test_the_demo_s_checks_pass_on_pre_training_seeds_0_1_and_2(folder):
    "The demo's configuration with seeds 0 (`make demo`), 1 and 2: its stored metrics and analysis tables pass every check."
    from nl_embryo.demo import demo_checks
    run = ROOT/'nbs'/'data'/folder
    assert json.loads((run/'config.json').read_text())['config']['seed'] == (0 if folder == 'demo' else int(folder[-1]))
    checks = demo_checks(run).set_index('check')
    assert list(checks.index) == ['left the unigram plateau', 'mask prediction: function words first', 'POS probe beats step 0']
    assert checks['passed'].eq(True).all(), checks['detail'].to_dict()
    assert 'before any content-word class: ' in checks.loc['mask prediction: function words first', 'detail']
