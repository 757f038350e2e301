"""The rendered docs site in a browser (issues 8 and 16): pages open from file:// in Debian's headless
Chromium, driven by Playwright, with every request that leaves the machine blocked and counted. Each page must load
with no blocked and no failed request (MathJax and every script come from the site's own `_static/`), draw its
charts, and show no page or console error. Search finds an API name and opens its anchor; the sidebar stays in view
on a long page and each page has a table of contents; no internal link or anchor of the site is dead; the attention
explorer's step slider works on the tutorial's page.

The site is the one `nl-embryo docs` built into `_docs/` (CI builds it just before pytest) when that build is the
nbconvert fallback and newer than the pages' notebooks; otherwise the test builds those pages itself, with
`build_docs`, in a small project in a temporary folder (same settings, site config, stylesheet and symbol index).
"""
import re, shutil, time
from pathlib import Path

import pytest

from conftest import fresh_fallback_site, require_browser

from nl_embryo.docs import build_docs, check_links

ROOT = Path(__file__).resolve().parents[1]
LOCAL = ('file:', 'data:', 'blob:', 'about:')
PAGES = {  # page -> (its notebook in nbs/, the fewest charts it must draw)
    'index.html': ('index.ipynb', 2),
    'attention.html': ('08_attention.ipynb', 3),
    'timeline.html': ('05_timeline.ipynb', 1),
    'probes.html': ('06_probes.ipynb', 3),
    'tutorials/first_embryo.html': ('tutorials/first_embryo.ipynb', 4),
    'tutorials/attention_explorer.html': ('tutorials/attention_explorer.ipynb', 2),
    'cli_reference.html': ('cli_reference.ipynb', 0),
}


def _build_pages(tmp: Path) -> Path:
    "Build just the pages of PAGES with `build_docs` in a small copy of the project; returns the site folder."
    proj = tmp/'project'
    for f in ('settings.ini', '_quarto.yml', 'nbs/styles.css', 'nl_embryo/_modidx.py', *(f'nbs/{nb}' for nb, _ in PAGES.values())):
        (proj/f).parent.mkdir(parents=True, exist_ok=True); shutil.copy2(ROOT/f, proj/f)
    r = build_docs(out=tmp/'site', root=proj, use_quarto=False, strict=True, readme=False, quiet=True)
    assert sorted(r.pages.values()) == sorted(PAGES), r.pages
    return r.out


@pytest.fixture(scope='module')
def site(tmp_path_factory):
    require_browser()
    docs = ROOT/'_docs'
    sources = [ROOT/'nbs'/nb for nb, _ in PAGES.values()] + [ROOT/'nl_embryo'/'docs.py', ROOT/'_quarto.yml']
    return docs if fresh_fallback_site(docs, PAGES, sources) else _build_pages(tmp_path_factory.mktemp('docs'))


CHARTS = """() => {
    const big = e => { const r = e.getBoundingClientRect(); return r.width > 50 && r.height > 30; };
    const svgs = [...document.querySelectorAll('svg')].filter(s => !s.parentElement.closest('svg'))
        .filter(s => big(s) && s.querySelectorAll('path, rect, line, text, circle').length > 20).length;
    const imgs = [...document.querySelectorAll('img')].filter(i => i.complete && i.naturalWidth > 50 && big(i)).length;
    const canvases = [...document.querySelectorAll('canvas')].filter(c => c.width > 50 && big(c)).length;
    return {svgs, imgs, canvases};
}"""


def _open(browser, url: str, **kw):
    "A new page at `url` with the network cut: returns (page, blocked requests, failed requests, page errors, console messages)."
    p = browser.new_page(viewport={'width': 1400, 'height': 1000})
    blocked, failed, errors, console = [], [], [], []
    def route(r):
        if r.request.url.startswith(LOCAL): r.continue_()
        else: blocked.append(r.request.url); r.abort()
    p.route('**/*', route)
    p.on('requestfailed', lambda r: failed.append(f"{r.url} ({r.failure})"))
    p.on('pageerror', lambda e: errors.append(str(e)))
    p.on('console', lambda m: console.append((m.type, m.text)))
    p.goto(url, wait_until='load', timeout=60_000, **kw)
    return p, blocked, failed, errors, console


@pytest.mark.parametrize('page', list(PAGES))
def test_page_loads_everything_from_the_site(site, browser, page):
    t0 = time.time()
    p, blocked, failed, errors, console = _open(browser, (site/page).as_uri())
    try:
        p.wait_for_timeout(500)   # MathJax typesets and live charts draw after load
        found = p.evaluate(CHARTS)
        title = p.title()
        links = p.eval_on_selector_all('nav.nl-nav a', 'as => as.map(a => a.getAttribute("href"))')
        scripts = p.eval_on_selector_all('script[src]', 'ss => ss.map(s => s.getAttribute("src"))')
        mathjax = p.evaluate('() => !!(window.MathJax && window.MathJax.startup && window.MathJax.version)')
        text = p.inner_text('main')
    finally:
        p.close()
    assert blocked == [] and failed == [], f"{page}: blocked {blocked}, failed {failed}"
    assert errors == [], f"page errors on {page}: {errors}"
    assert [m for m in console if m[0] == 'error'] == [], f"console errors on {page}: {console}"
    assert any(s.endswith('_static/mathjax/tex-chtml.js') for s in scripts) and mathjax, scripts   # MathJax 3, from the site
    assert not any(re.match(r'(https?:)?//', s) for s in scripts), scripts
    _, fewest = PAGES[page]
    assert sum(found.values()) >= fewest, f"{page} drew {found}, expected at least {fewest} charts"
    assert not [m for m in console if 'spec uses Vega' in m[1]], console   # each live spec names the Vega the site ships
    assert 'nl_embryo' in title
    assert 'VBox(children=' not in text and 'HBox(children=' not in text   # no widget repr
    # the sidebar's links, relative to this page, lead to pages of the site
    targets = [((site/page).parent/h.split('#')[0]).resolve() for h in links if not h.startswith(('http:', 'https:', '#'))]
    assert len(targets) >= 3 and all(t.is_file() for t in targets), [t for t in targets if not t.is_file()]
    assert time.time() - t0 < 90


def test_search_finds_run_map_and_opens_its_anchor(site, browser):
    p, blocked, failed, errors, _ = _open(browser, (site/'index.html').as_uri())
    try:
        p.fill('input.nl-search', 'Run.map')
        p.wait_for_selector('ul.nl-results a.nl-result', timeout=5_000)
        hits = p.eval_on_selector_all('ul.nl-results a.nl-result', 'as => as.map(a => [a.textContent, a.getAttribute("href")])')
        assert hits[0] == ['Run.map', 'timeline.html#run.map'], hits[:5]
        p.click('ul.nl-results a.nl-result >> nth=0')
        p.wait_for_url('**/timeline.html#run.map', timeout=10_000)
        p.wait_for_timeout(300)
        box = p.evaluate('() => { const r = document.getElementById("run.map").getBoundingClientRect(); return [r.top, window.scrollY]; }')
        # a word of the text finds pages too, and an unknown word says so
        p.fill('input.nl-search', 'checkpoint timeline')
        p.wait_for_selector('ul.nl-results a.nl-result', timeout=5_000)
        n_text = p.locator('ul.nl-results a.nl-result').count()
        p.fill('input.nl-search', 'zzqxv')
        none = p.inner_text('ul.nl-results')
    finally:
        p.close()
    assert -2 < box[0] < 200 and box[1] > 500, f"the anchor is not scrolled into view: top {box[0]}, scrollY {box[1]}"
    assert n_text >= 3 and none == 'no match'
    assert blocked == failed == errors == []


def test_sticky_sidebar_and_table_of_contents(site, browser):
    p, *_ = _open(browser, (site/'probes.html').as_uri())
    try:
        height = p.evaluate('() => document.documentElement.scrollHeight')
        p.evaluate('() => window.scrollTo(0, document.documentElement.scrollHeight)')
        p.wait_for_timeout(200)
        nav = p.evaluate('''() => { const n = document.querySelector('nav.nl-nav'), r = n.getBoundingClientRect();
                                    return {pos: getComputedStyle(n).position, top: r.top, bottom: r.bottom, y: window.scrollY}; }''')
        toc = p.eval_on_selector_all('nav.nl-toc a', 'as => as.map(a => [a.textContent, a.getAttribute("href")])')
        toc_box = p.evaluate('() => document.querySelector("nav.nl-toc").getBoundingClientRect().top')
        missing = p.evaluate('''hs => hs.filter(h => !document.getElementById(decodeURIComponent(h.slice(1))) && !document.getElementById(h.slice(1)))''',
                             [h for _, h in toc])
        heads = p.evaluate('() => [...document.querySelectorAll("main h2[id], main h3[id]")].length')
    finally:
        p.close()
    assert height > 8000 and nav['y'] > 5000, (height, nav)            # a long page, scrolled to its end
    # the sidebar is still in view, at the top to within a pixel (a live chart drawn by Vega can leave the page a
    # fractional height, so the page scrolled to its end sits a fraction of a pixel off)
    assert nav['pos'] == 'sticky' and abs(nav['top']) < 1 and nav['bottom'] > 500, nav
    assert len(toc) == heads >= 10 and missing == [] and abs(toc_box) < 1, (len(toc), heads, missing, toc_box)
    assert ['ProbeTask', '#probetask'] in toc


def test_no_dead_internal_links(site):
    "No dead link or anchor on the site (in a build of PAGES alone, links to the other chapters' pages are not checked)."
    whole = site == ROOT/'_docs'
    dead = [d for d in check_links(site) if whole or not re.match(r'^[^:]+: ([^#]+\.html)', d) or
            (site/d.split(': ')[0]).parent.joinpath(d.split(': ')[1].split('#')[0]).resolve().relative_to(site.resolve()).as_posix() in PAGES]
    assert dead == [], f"{len(dead)} dead link(s): {dead[:10]}"
    # the API anchors the README links to exist on the site
    readme = (ROOT/'README.md').read_text(encoding='utf-8')
    anchors = set(re.findall(r'https://nl-embryo\.github\.io/nl_embryo/([\w/]+\.html)#([\w.-]+)', readme))
    anchors |= {('timeline.html', a) for a in ('run.map', 'run.load', 'run.metrics', 'run.steps')} | {('probes.html', 'probetask.data')}
    for page, a in sorted(anchors):
        if (site/page).exists() or page in PAGES:
            assert f'id="{a}"' in (site/page).read_text(encoding='utf-8'), f"{page}#{a}"


def test_chapter_pages_have_the_api_reference(site):
    "nbdev's show_doc entries of the exported functions and classes, and of the classes' methods, with their source links."
    html = (site/'attention.html').read_text(encoding='utf-8')
    for name in ('load_attention', 'attention_tables', 'pattern_scores_chart', 'attentionexplorer'):
        assert f'<h3 id="{name}"' in html, name
    assert '<h3 id="attentionexplorer.from_run"' in html and '<h3 id="attentionexplorer.from_runs"' in html   # added with @patch: nbdev's own entries
    assert '<h3 id="attentionexplorer.step_chart"' in html   # a method added with @patch: nbdev's own entry, not a second one
    assert html.count('>source</a>') >= 10 and '#LNone' not in html
    timeline = (site/'timeline.html').read_text(encoding='utf-8')
    for m in ('map', 'load', 'metrics', 'steps'):     # a method in the class body: h4; one added with @patch: nbdev's own h3 entry
        assert f'<h4 id="run.{m}"' in timeline or f'<h3 id="run.{m}"' in timeline, m
    assert '<h4 id="run._checkpoint_id"' not in timeline   # private methods stay out


def test_attention_explorer_slider_works_on_the_docs_page(site, browser):
    p, blocked, failed, errors, _ = _open(browser, (site/'tutorials/attention_explorer.html').as_uri())
    try:
        p.wait_for_selector('div.nl-live.nl-drawn .nl-view svg', timeout=20_000)
        steps = p.locator('div.nl-live input[type=radio]')     # checkpoints 0, 10, 30: a button per step, labelled by it
        shown = [steps.nth(i).get_attribute('value') for i in range(steps.count())]
        view = '() => document.querySelector("div.nl-live .nl-view svg").outerHTML'
        title = '() => document.querySelector("div.nl-live .nl-view svg .role-title").textContent'
        before, title_before = p.evaluate(view), p.evaluate(title)
        steps.first.check()                                    # step 0, and the input's change event
        p.wait_for_function('b => document.querySelector("div.nl-live .nl-view svg").outerHTML !== b', arg=before, timeout=5_000)
        after, title_after = p.evaluate(view), p.evaluate(title)
        rects = p.evaluate('() => document.querySelectorAll("div.nl-live .nl-view svg path, div.nl-live .nl-view svg rect").length')
    finally:
        p.close()
    assert shown == ['0', '10', '30'] and after != before and rects > 100   # the input shows the steps, not their index
    assert title_before.endswith('step 30') and title_after.endswith('step 0'), (title_before, title_after)
    assert blocked == failed == errors == []


def test_saved_widget_state_renders_from_the_site(tmp_path, browser):
    "A page with saved widget state draws its widgets with the ipywidgets embed script the site serves itself (not a CDN)."
    import ipywidgets as W, nbformat
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output
    proj = tmp_path/'p'; (proj/'nbs').mkdir(parents=True)
    shutil.copy2(ROOT/'settings.ini', proj/'settings.ini')
    s = W.IntSlider(value=7, description='width')
    nb = new_notebook(cells=[new_markdown_cell('# widgets\n\n> A page with a saved widget.'), new_code_cell('s', outputs=[new_output(
        'display_data', data={'application/vnd.jupyter.widget-view+json': {'model_id': s.model_id, 'version_major': 2, 'version_minor': 0},
                              'text/plain': 'IntSlider(value=7)'})])])
    nb.metadata['widgets'] = {'application/vnd.jupyter.widget-state+json': W.Widget.get_manager_state(drop_defaults=False, widgets=[s])}
    nbformat.write(nb, proj/'nbs'/'index.ipynb')
    r = build_docs(root=proj, quiet=True, readme=False, use_quarto=False)
    assert (r.out/'_static'/'widgets'/'embed.js').is_file()
    p, blocked, failed, errors, console = _open(browser, (r.out/'index.html').as_uri())
    try:
        p.wait_for_selector('main .widget-slider', timeout=15_000)
        text = p.inner_text('main')
    finally:
        p.close()
    assert 'width' in text and '7' in text and 'IntSlider(' not in text
    assert blocked == failed == errors == [] and [m for m in console if m[0] == 'error'] == [], (blocked, failed, errors, console)


def test_docs_read_like_a_reference(site, browser):
    """Readable, grouped sidebar titles; signatures without raw markdown and a parameter table under each; a Copy
    button on code that copies the code; search hits with a snippet; a CLI reference with each command's flags."""
    p, blocked, failed, errors, _ = _open(browser, (site/'attention.html').as_uri())
    try:
        sections = p.eval_on_selector_all('nav.nl-nav .nl-section', 'ss => ss.map(s => s.textContent)')
        titles = p.eval_on_selector_all('nav.nl-nav li > a', 'as => as.map(a => a.textContent)')
        raw = p.evaluate('() => [...document.querySelectorAll("main pre")].filter(e => /\\]\\(https?:/.test(e.textContent)).length')
        entries = p.evaluate('() => document.querySelectorAll("main h3[id]").length')
        tables = p.evaluate('() => [...document.querySelectorAll("main table")].filter(t => /Details/.test(t.querySelector("thead")?.textContent || "")).length')
        linked = p.evaluate('() => [...document.querySelectorAll("main table td a code")].length')
        # the Copy button copies the code, whichever clipboard path the browser takes
        p.evaluate("""() => { window.__copied = null;
            if (navigator.clipboard) navigator.clipboard.writeText = t => { window.__copied = t; return Promise.resolve(); };
            document.execCommand = () => { window.__copied = document.activeElement.value; return true; }; }""")
        pre = p.locator('main div.highlight pre').first
        code = pre.evaluate('e => [...e.childNodes].filter(n => !(n.matches && n.matches("button"))).map(n => n.textContent).join("")')
        n_pre, n_buttons = p.locator('main div.highlight pre').count(), p.locator('main div.highlight pre button.nl-copy').count()
        pre.hover(); pre.locator('button.nl-copy').click()
        p.wait_for_function('() => window.__copied !== null', timeout=5_000)
        copied, label = p.evaluate('() => window.__copied'), pre.locator('button.nl-copy').text_content()
        p.fill('input.nl-search', 'checkpoint timeline')
        p.wait_for_selector('ul.nl-results .nl-snippet mark', timeout=5_000)
        snippets = p.eval_on_selector_all('ul.nl-results .nl-snippet', 'ss => ss.map(s => s.textContent)')
    finally:
        p.close()
    assert {'Tutorials', 'What is learned'} <= set(sections), sections
    assert 'Attention heads' in titles and not [t for t in titles[1:] if re.fullmatch(r'[a-z_]+', t)], titles   # titles, not file names (after the site's own)
    assert raw == 0 and entries >= 10 and tables >= 0.8 * entries and linked >= 5, (raw, entries, tables, linked)
    assert n_buttons == n_pre > 10 and copied == code.rstrip('\n') and 'Copy' not in copied[-6:] and label == 'Copied'
    assert len(snippets) >= 3 and any('checkpoint' in s.lower() for s in snippets)
    assert blocked == failed == errors == []
    cli = (site/'cli_reference.html').read_text(encoding='utf-8')
    for cmd in ('nl-embryo pretrain', 'nl-embryo analyze', 'nl-embryo data fetch', 'nl-embryo tensorboard'):
        assert re.search(rf'<h2 id="[^"]+"[^>]*>{cmd}', cli), cmd
    assert '<code>--report-to REPORT_TO</code>' in cli and 'nl-embryo data fetch sentiment bbc-news' in re.sub(r'<[^>]+>', '', cli)
