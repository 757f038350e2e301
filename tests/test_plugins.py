"""Plug-ins through the console script: an installed package (here a `dist-info` folder on `sys.path`) whose entry points
add an analysis (a module whose import registers it) and an architecture (an `Architecture` object) to nl_embryo, with no
change to nl_embryo: the analysis is a flag of `analyze`, runs, and gets its section in the report; the architecture is a
choice of `pretrain --arch`. A plug-in that fails to import is named, and the command still works."""
import os, shutil, subprocess
from pathlib import Path

import pytest

from conftest import nl_embryo_cmd

PLUGIN = '''
import pandas as pd
from nl_embryo.registry import Analysis, register

def param_count_checkpoint(model, tokenizer, data):
    "The number of parameters of a checkpoint."
    return pd.DataFrame([dict(metric='parameters', value=float(sum(p.numel() for p in model.parameters())))])

register(Analysis('param_count', 'Parameter count (a plug-in)', param_count_checkpoint, lambda run: [None], key=('metric',),
                  section=lambda run, t: ['How many parameters each checkpoint has: an analysis from an installed plug-in.', t['param_count']],
                  description='the number of parameters of each checkpoint (an analysis from a plug-in)'), replace=True)
'''
ARCH = '''
from nl_embryo.architectures import BUILTIN_PARTS, Architecture
WIDE = Architecture('widebert', 'mlm', 'nl_embryo.models:bert_config', {'bert': BUILTIN_PARTS['bert']}, description='BERT under a plug-in name')
'''
ENTRY_POINTS = '''[nl_embryo.analyses]
param_count = myplug
broken = no_such_module_of_a_broken_plugin

[nl_embryo.architectures]
widebert = myplug.arch:WIDE
'''


@pytest.fixture(scope='module')
def plugin_env(tmp_path_factory):
    "An environment whose sys.path holds the installed plug-in `myplug` (its package and its dist-info with the entry points)."
    site = tmp_path_factory.mktemp('site')
    (site/'myplug').mkdir(); (site/'myplug'/'__init__.py').write_text(PLUGIN); (site/'myplug'/'arch.py').write_text(ARCH)
    info = site/'myplug-0.1.dist-info'; info.mkdir()
    (info/'METADATA').write_text('Metadata-Version: 2.1\nName: myplug\nVersion: 0.1\n')
    (info/'entry_points.txt').write_text(ENTRY_POINTS)
    return dict(os.environ, PYTHONPATH=f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", OMP_NUM_THREADS='1')


def nl(env, *args, timeout=600):
    return subprocess.run(nl_embryo_cmd(*args), capture_output=True, text=True, env=env, timeout=timeout)


def test_a_plugin_analysis_is_a_flag_runs_and_has_its_report_section(tmp_path, plugin_env, reference):
    r = nl(plugin_env, 'analyze', '--help')
    assert r.returncode == 0 and "--param_count" in r.stdout and "an analysis from a plug-in" in " ".join(r.stdout.split()), r.stdout + r.stderr
    assert "plug-in 'broken'" in r.stderr and 'ModuleNotFoundError' in r.stderr and 'no_such_module_of_a_broken_plugin' in r.stderr
    r = nl(plugin_env, 'pretrain', '--help')
    assert r.returncode == 0 and 'widebert' in r.stdout
    run = tmp_path/'run'; shutil.copytree(reference, run)
    r = nl(plugin_env, 'analyze', run, '--param_count', '--quiet')
    assert r.returncode == 0, r.stderr[-3000:]
    assert 'param_count:' in r.stdout and (run/'analysis'/'param_count.parquet').exists()
    r = nl(plugin_env, 'report', run)
    assert r.returncode == 0, r.stderr[-3000:]
    html = (run/'report.html').read_text(encoding='utf-8')
    assert 'Parameter count (a plug-in)' in html and 'an analysis from an installed plug-in' in html
    assert not (run/'analysis'/'param_count.parquet').exists() or nl(os.environ, 'analyze', '--help').stdout.count('--param_count') == 0   # without the plug-in: no flag
