"""The docs build (`nl_embryo.docs.build_docs`, `nl-embryo docs`) end to end.

Most tests build a tiny nbdev project of their own in `tmp_path` (its own settings.ini, an index, a chapter with an
Altair chart, a chapter with an error output): the chapters of this repository change while they are written, and
a test must not depend on them. One test builds this repository's own docs into a temporary folder.
"""
import os, re, stat, textwrap
from pathlib import Path

import nbformat
import pytest
import yaml
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from conftest import fresh_fallback_site
from nl_embryo.core import NlEmbryoError
from nl_embryo.docs import build_docs, chart_output_to_svg, notebook_errors, resolve_sidebar

ROOT = Path(__file__).resolve().parents[1]

SETTINGS = """[DEFAULT]
repo = tiny
lib_name = tiny
version = 0.0.1
min_python = 3.11
license = apache2
black_formatting = False
doc_path = _docs
lib_path = tiny
nbs_path = nbs
recursive = True
tst_flags = notest
put_version_in_init = True
branch = main
custom_sidebar = False
doc_host = https://example.org
doc_baseurl = /tiny
git_url = https://github.com/example/tiny
title = tiny
description = A tiny docs site.
user = example
author = me
author_email = me@example.org
copyright = 2026
keywords = tiny
language = English
status = 3
audience = Developers
readme_nb = index.ipynb
"""

QUARTO_YML = """project:
  type: website
  output-dir: _docs
format:
  html:
    theme: cosmo
    css: styles.css
    toc: true
website:
  title: "tiny site"
  navbar:
    search: true
  sidebar:
    style: floating
    contents:
      - index.ipynb
      - "/[0-9]*.ipynb"
      - section: experiments
        contents: "experiments/*.ipynb"
"""


def _save(path, *cells):
    nb = new_notebook(cells=list(cells))
    nb.metadata.kernelspec = {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)


def _chart():
    import altair as alt, pandas as pd
    return alt.Chart(pd.DataFrame({'step': [0, 10, 100, 1000], 'loss': [9.1, 6.0, 4.2, 3.1]})).mark_line().encode(x='step', y='loss')


def make_project(d: Path, broken=True, experiment=False, quarto_yml=True) -> Path:
    "A tiny nbdev project: index, a chapter with two Altair charts, optionally a chapter with an error output and an experiment."
    (d/'nbs').mkdir(parents=True, exist_ok=True)
    (d/'settings.ini').write_text(SETTINGS)
    if quarto_yml: (d/'_quarto.yml').write_text(QUARTO_YML)
    _save(d/'nbs'/'index.ipynb', new_markdown_cell("# tiny\n\n> A tiny docs site."),
          new_markdown_cell("The index is the README. See [`double`](https://example.org/tiny/chart.html#double)."))
    chart = _chart()
    as_html = chart._repr_mimebundle_()
    as_html = as_html[0] if isinstance(as_html, tuple) else as_html            # what nbconvert / papermill runs keep
    as_mime = {'application/vnd.vegalite.v6+json': chart.to_dict(), 'text/plain': 'alt.Chart(...)'}   # what JupyterLab keeps
    _save(d/'nbs'/'01_chart.ipynb', new_markdown_cell("# chart\n\n> A loss curve."),
          new_code_cell("#| export\ndef double(x):\n    \"Twice `x`.\"\n    return 2*x"),
          new_code_cell("#| hide\nsecret = 42"),
          new_code_cell("chart", outputs=[new_output('execute_result', data=as_html, execution_count=1)]),
          new_code_cell("chart", outputs=[new_output('display_data', data=as_mime)]))
    if broken:
        _save(d/'nbs'/'02_broken.ipynb', new_markdown_cell("# broken\n\n> A page whose cell failed."),
              new_code_cell("raise ValueError('boom')",
                            outputs=[new_output('error', ename='ValueError', evalue='boom', traceback=['ValueError: boom'])]))
    if experiment:
        _save(d/'nbs'/'experiments'/'probe_run.ipynb', new_markdown_cell("# probe run\n\n> An experiment."),
              new_code_cell("print(1)", outputs=[new_output('stream', name='stdout', text='1\n')]))
    return d


@pytest.fixture
def project(tmp_path, monkeypatch):
    d = make_project(tmp_path/'tiny')
    monkeypatch.chdir(d)
    return d


def test_strict_build_names_the_failing_page_and_writes_nothing(project):
    with pytest.raises(NlEmbryoError) as ei:
        build_docs(use_quarto=False, quiet=True)
    msg = str(ei.value)
    assert '02_broken.ipynb' in msg and 'ValueError: boom' in msg and "raise ValueError('boom')" in msg
    assert 'strict=False' in msg                      # says what to do
    assert not (project/'_docs').exists()            # nothing half-built
    assert not [p for p in project.iterdir() if p.name.startswith('._docs')]


def test_fallback_site(project):
    (project/'README.md').write_text('stale\n')
    r = build_docs(use_quarto=False, strict=False, quiet=True)
    docs = project/'_docs'
    assert r.renderer == 'nbconvert' and r.out == docs.resolve()
    assert r.pages == {'index.ipynb': 'index.html', '01_chart.ipynb': 'chart.html', '02_broken.ipynb': 'broken.html'}
    for page in r.pages.values(): assert (docs/page).is_file()
    # the error page is reported, the others are not
    assert list(r.errors) == ['02_broken.ipynb'] and 'ValueError: boom' in r.errors['02_broken.ipynb'][0] and not r.ok
    # both chart forms became inline SVG; nothing needs vega from a CDN
    chart = (docs/'chart.html').read_text()
    assert r.charts == 2 and chart.count('<svg') == 2 and chart.count('class="nl-chart"') == 2
    assert 'vegaEmbed' not in chart and 'cdn.jsdelivr' not in chart and 'require.min.js' not in chart
    # nbdev's processing: show_doc for the export, hidden cell gone, title from the first cell
    assert 'Twice' in chart and '<h3 id="double"' in chart and 'secret = 42' not in chart
    assert '<title>chart – tiny site</title>' in chart
    # a shared sidebar on every page, from _quarto.yml
    for page in r.pages.values():
        text = (docs/page).read_text()
        nav = re.search(r'<nav class="nl-nav">.*?</nav>', text, re.S).group(0)
        assert all(f'href="{p}"' in nav for p in r.pages.values()) and 'tiny site' in nav
    # links to the published site point at the local pages
    assert 'href="chart.html#double"' in (docs/'index.html').read_text()
    # README.md regenerated from the index notebook
    readme = (project/'README.md').read_text()
    assert r.readme == project/'README.md' and readme.startswith('# tiny\n\n> A tiny docs site.') and 'The index is the README' in readme
    # the processed folder holds the resolved site config for Quarto
    site = yaml.safe_load((project/'_proc'/'_quarto.yml').read_text())
    assert site['website']['sidebar']['contents'] == ['index.ipynb', '01_chart.ipynb', '02_broken.ipynb']


def test_failed_strict_build_keeps_the_last_good_site(tmp_path, monkeypatch):
    d = make_project(tmp_path/'tiny', broken=False)
    r = build_docs(root=d, use_quarto=False, quiet=True)          # root= works from any cwd
    assert r.ok and sorted(r.pages) == ['01_chart.ipynb', 'index.ipynb']
    before = (d/'_docs'/'chart.html').read_text()
    make_project(d, broken=True)
    with pytest.raises(NlEmbryoError, match='02_broken.ipynb'):
        build_docs(root=d, use_quarto=False, quiet=True)
    assert (d/'_docs'/'chart.html').read_text() == before and not (d/'_docs'/'broken.html').exists()


def test_experiments_section_and_deleted_pages(tmp_path):
    d = make_project(tmp_path/'tiny', broken=False, experiment=True)
    r = build_docs(root=d, use_quarto=False, quiet=True)
    assert r.pages['experiments/probe_run.ipynb'] == 'experiments/probe_run.html'
    page = (d/'_docs'/'experiments'/'probe_run.html').read_text()
    assert 'nl-section">experiments<' in page and 'href="../chart.html"' in page and 'class="nl-here">probe run<' in page
    (d/'nbs'/'experiments'/'probe_run.ipynb').unlink()
    r = build_docs(root=d, use_quarto=False, quiet=True)
    assert 'experiments/probe_run.ipynb' not in r.pages and not (d/'_docs'/'experiments').exists()
    assert 'experiments' not in (d/'_docs'/'index.html').read_text().split('<nav', 1)[1].split('</nav>')[0]


def test_a_notebook_nbdev_cannot_process_is_named(tmp_path):
    d = make_project(tmp_path/'tiny', broken=False, quarto_yml=False)
    _save(d/'nbs'/'03_bad.ipynb', new_markdown_cell("# bad\n\n> An export that fails."),
          new_code_cell("#| export\nfrom tiny_missing_module import thing"))
    r = build_docs(root=d, use_quarto=False, strict=False, quiet=True)
    assert list(r.errors) == ['03_bad.ipynb'] and 'tiny_missing_module' in r.errors['03_bad.ipynb'][0]
    assert '03_bad.ipynb' not in r.pages and not (d/'_proc'/'03_bad.ipynb').exists()
    assert (d/'_docs'/'index.html').exists()        # without _quarto.yml: a site from settings.ini


def test_quarto_is_used_when_on_path(tmp_path, monkeypatch):
    "With `quarto` on PATH the build runs `quarto render` in _proc/ and publishes its output (a stand-in quarto here)."
    d = make_project(tmp_path/'tiny', broken=False)
    bin_ = tmp_path/'bin'; bin_.mkdir()
    stub = bin_/'quarto'
    stub.write_text(textwrap.dedent("""\
        #!/bin/sh
        echo "$(pwd -P) $*" > ../quarto-called
        test -f _quarto.yml && test -f 01_chart.ipynb || exit 3
        mkdir -p _docs && echo '<html>rendered by quarto</html>' > _docs/index.html
        """))
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv('PATH', f"{bin_}{os.pathsep}{os.environ['PATH']}")
    r = build_docs(root=d, quiet=True)
    assert r.renderer == 'quarto' and (d/'_docs'/'index.html').read_text().strip() == '<html>rendered by quarto</html>'
    assert (d/'quarto-called').read_text().split() == [str((d/'_proc').resolve()), 'render', '--no-cache']
    assert r.pages == {'index.ipynb': 'index.html', '01_chart.ipynb': 'chart.html'}
    # a failing quarto stops the build with its message and keeps the old site
    stub.write_text("#!/bin/sh\necho 'ERROR: bad page' >&2\nexit 1\n")
    with pytest.raises(NlEmbryoError, match='bad page'):
        build_docs(root=d, quiet=True)
    assert 'rendered by quarto' in (d/'_docs'/'index.html').read_text()


def test_build_from_a_script_on_stdin(tmp_path):
    "Spawned workers cannot start from a script on stdin: the notebooks are then processed in the calling process."
    import subprocess, sys
    d = make_project(tmp_path/'tiny', broken=False)
    script = f"from nl_embryo.docs import build_docs\nr = build_docs(root={str(d)!r}, use_quarto=False, quiet=True)\nprint(sorted(r.pages), r.ok)\n"
    p = subprocess.run([sys.executable, '-'], input=script, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().splitlines()[-1] == "['01_chart.ipynb', 'index.ipynb'] True"


def test_use_quarto_without_quarto_says_how_to_fix(project, monkeypatch):
    monkeypatch.setenv('PATH', '/nonexistent')
    with pytest.raises(NlEmbryoError, match='quarto'):
        build_docs(use_quarto=True, quiet=True)


def test_no_project_is_a_clear_error(tmp_path):
    with pytest.raises(NlEmbryoError, match='settings.ini'):
        build_docs(root=tmp_path, quiet=True)


def test_chart_outputs_to_svg():
    chart = _chart()
    html_out = chart._repr_mimebundle_()
    html_out = html_out[0] if isinstance(html_out, tuple) else html_out
    o = nbformat.from_dict(new_output('execute_result', data=html_out, execution_count=1))
    assert chart_output_to_svg(o) and '<svg' in o.data['text/html'] and 'vegaEmbed' not in o.data['text/html']
    o = nbformat.from_dict(new_output('display_data', data={'application/vnd.vegalite.v5+json': chart.to_dict(), 'text/plain': 'c'}))
    assert chart_output_to_svg(o, inline=False) and o.data['image/svg+xml'].startswith('<svg')
    png = nbformat.from_dict(new_output('display_data', data={'image/png': 'iVBOR', 'application/vnd.vegalite.v6+json': {}}))
    assert not chart_output_to_svg(png) and list(png.data) == ['image/png']   # a static image is kept as it is


def test_notebook_errors_reads_stderr_tracebacks():
    nb = new_notebook(cells=[new_code_cell("f()", outputs=[new_output('stream', name='stderr', text='Traceback (most recent call last):\nKeyError: 3\n')]),
                             new_code_cell("g()", outputs=[new_output('stream', name='stderr', text='a warning\n')])])
    assert notebook_errors(nb) == ['cell 0 (`f()`): traceback on stderr: KeyError: 3']


def test_repo_quarto_yml_sidebar():
    site = yaml.safe_load((ROOT/'_quarto.yml').read_text())
    assert site['project']['output-dir'] == '_docs' and site['format']['html']['theme'] == 'cosmo'
    assert site['format']['html']['toc'] and site['website']['navbar']['search']
    pages = ['index.ipynb', '01_data.ipynb', '00_core.ipynb', 'experiments/e1.ipynb', '99_new_chapter.ipynb']
    assert resolve_sidebar(site['website']['sidebar']['contents'], pages) == \
        ['index.ipynb', {'section': 'Pre-training', 'contents': ['01_data.ipynb']}, {'section': 'Experiments', 'contents': ['experiments/e1.ipynb']},
         {'section': 'Reference', 'contents': ['00_core.ipynb', '99_new_chapter.ipynb']}]    # a chapter not named yet still gets a place
    # the repository's own pages: each in the sidebar exactly once, grouped, none left out
    repo = [p.relative_to(ROOT/'nbs').as_posix() for p in (ROOT/'nbs').rglob('*.ipynb') if '.ipynb_checkpoints' not in p.parts]
    nav = resolve_sidebar(site['website']['sidebar']['contents'], repo)
    placed = [x for e in nav for x in ([e] if isinstance(e, str) else e['contents'])]
    assert sorted(placed) == sorted(repo) and nav[0] == 'index.ipynb'
    assert [e['section'] for e in nav[1:]] == ['Tutorials', 'Pre-training', 'Timelines', 'What is learned', 'Interventions', 'Experiments', 'Reference']


def test_repo_docs_build(tmp_path):
    """This repository's own docs build with the fallback (chapters being written may carry errors: not strict here).
    The site CI built just before pytest is read when it is newer than every notebook; otherwise it is built here."""
    site = ROOT/'_docs'
    pages = [p.relative_to(site) for p in site.rglob('*.html')] if site.is_dir() else []
    if not fresh_fallback_site(site, pages, [*(ROOT/'nbs').rglob('*.ipynb'), ROOT/'nl_embryo'/'docs.py', ROOT/'_quarto.yml']):
        r = build_docs(out=tmp_path/'site', root=ROOT, use_quarto=False, strict=False, readme=False, quiet=True)
        assert r.pages['index.ipynb'] == 'index.html' and r.pages['00_core.ipynb'] == 'core.html'
        assert r.out == (tmp_path/'site').resolve()
        site = r.out
    pages = {p.relative_to(site).as_posix() for p in site.rglob('*.html')}
    notebooks = {p.relative_to(ROOT/'nbs').with_suffix('').as_posix() for p in (ROOT/'nbs').rglob('*.ipynb') if '.ipynb_checkpoints' not in p.parts}
    assert len(pages) >= len(notebooks) - 1 and 'index.html' in pages and 'core.html' in pages    # a page per notebook
    core = (site/'core.html').read_text()
    assert 'NlEmbryoError' in core and '<nav class="nl-nav">' in core and 'href="index.html"' in core
    assert re.search(r'<a href="https://github.com/[^"]+/core.py#L\d+"[^>]*>source</a>', core)      # nbdev's source links survive
    assert '<h3 id="nlembryoerror"' in core and 'href="core.html#nlembryoerror"' in core             # and its symbol links resolve


def test_notebooks_are_light_and_carry_no_widget_state():
    "Saved widget state made most of a chapter's size and a tutorial passed 1 MB: neither comes back."
    import json
    for nb_path in sorted((ROOT/'nbs').rglob('*.ipynb')):
        nb = json.loads(nb_path.read_text())
        assert 'widgets' not in nb.get('metadata', {}), f"{nb_path.relative_to(ROOT)} carries saved widget state"
        limit = 300_000 if 'tutorials' in nb_path.parts else 400_000
        assert nb_path.stat().st_size < limit, f"{nb_path.relative_to(ROOT)}: {nb_path.stat().st_size:,} bytes (limit {limit:,})"


def test_chart_outputs_name_their_data_sources_as_text():
    """nbdev's docs processor splits every value keyed `source` as text: a stored Vega spec whose data entry names its
    source as a list (as Vega's compiler writes some) stops the chapter's page. Such a list of one name is stored as the name."""
    import json
    bad = []
    for nb_path in sorted((ROOT/'nbs').rglob('*.ipynb')):
        for cell in json.loads(nb_path.read_text())['cells']:
            for out in cell.get('outputs', []):
                for d in (out.get('data', {}).get('application/vnd.vega.v5+json') or {}).get('data', []):
                    if 'source' in d and not isinstance(d['source'], str): bad.append(f"{nb_path.relative_to(ROOT)} cell {cell.get('id')}")
    assert not bad, f"Vega data sources stored as lists (store the single name as text): {sorted(set(bad))}"


def test_live_chart_outputs_to_svg(tmp_path):
    """What the `nl_embryo` renderer shows in a notebook (a Vega 5 spec for JupyterLab's own Vega) goes through nbdev's
    processing (execnb's reader takes any key named `source` for text) and becomes a static SVG on the docs pages."""
    from execnb.nbio import read_nb, write_nb
    from nl_embryo.charts import VEGA_MIME, vega_mimebundle
    bundle, meta = vega_mimebundle(_chart().properties(title='loss over steps').to_dict())
    nbformat.write(new_notebook(cells=[new_code_cell('chart', outputs=[new_output('display_data', data=bundle, metadata=meta)])]), tmp_path/'a.ipynb')
    write_nb(read_nb(tmp_path/'a.ipynb'), tmp_path/'b.ipynb')                    # what nbdev_proc_nbs does to every page
    o = nbformat.read(tmp_path/'b.ipynb', as_version=4).cells[0].outputs[0]
    assert chart_output_to_svg(o) and list(o.data) == ['text/plain', 'text/html'] and VEGA_MIME not in o.data
    assert '<svg' in o.data['text/html'] and 'loss over steps' in o.data['text/html'] and 'http' not in o.data['text/html'].replace('http://www.w3.org', '')


def test_no_notebook_output_loads_a_script_from_the_web():
    """Altair's default html output loads Vega from cdn.jsdelivr.net, which leaves the chart blank offline (issue 16): no
    stored output of any notebook under nbs/ may name a CDN or load a script from an `http(s)://` address."""
    import json
    script = re.compile(r'<script\b[^>]*\bsrc\s*=\s*["\']?(?:https?:)?//', re.I)          # <script src="https://...">
    loader = re.compile(r'<script\b[^>]*>((?:(?!</script>).)*)</script>', re.I | re.S)     # an inline script's code
    url = re.compile(r'["\'](?:https?:)?//[^"\']+["\']')
    bad = []
    for nb_path in sorted((ROOT/'nbs').rglob('*.ipynb')):
        if '.ipynb_checkpoints' in nb_path.parts: continue
        for i, c in enumerate(json.loads(nb_path.read_text())['cells']):
            for o in c.get('outputs', []):
                for mime, v in (o.get('data') or {}).items():
                    text = ''.join(v) if isinstance(v, list) else v if isinstance(v, str) else json.dumps(v)
                    codes = [text] if 'javascript' in mime else [m.group(1) for m in loader.finditer(text)] if 'html' in mime else []
                    # a script's URLs other than a Vega/Vega-Lite "$schema" (an identifier, never fetched)
                    urls = [u for code in codes for u in url.findall(re.sub(r'"\$schema"\s*:\s*"[^"]*"', '', code))]
                    if 'cdn.jsdelivr' in text or script.search(text) or urls:
                        bad.append(f"{nb_path.relative_to(ROOT)} cell {i} ({mime}): {urls[:2] or 'cdn.jsdelivr / script src'}")
    assert bad == [], bad


def test_tutorial_clean_up_runs_only_under_the_test_runner():
    "Run All in JupyterLab keeps the tutorial's run: a cell that removes it does so only under nbdev_test (IN_TEST)."
    import json
    cells = [(nb.name, ''.join(c['source'])) for nb in sorted((ROOT/'nbs'/'tutorials').glob('*.ipynb'))
             for c in json.loads(nb.read_text())['cells'] if c['cell_type'] == 'code']
    removing = [(name, src) for name, src in cells if 'rmtree' in src]
    assert len(removing) >= 5
    assert all("os.environ.get('IN_TEST')" in src for _, src in removing), [name for name, src in removing if 'IN_TEST' not in src]


def test_every_chapter_has_a_title_for_the_sidebar():
    "The docs sidebar shows each chapter's title: every notebook opens with a '# title' cell, not its file name."
    import json
    untitled = [nb.name for nb in sorted((ROOT/'nbs').rglob('*.ipynb')) if '.ipynb_checkpoints' not in nb.parts
                and not ''.join(json.loads(nb.read_text())['cells'][0]['source']).startswith('# ')]
    assert not untitled, untitled
