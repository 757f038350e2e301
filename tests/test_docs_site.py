"""The rendered docs site in a browser (DESIGN §7, issue 8): three pages — the index, a library chapter with charts
(attention) and a tutorial (your first embryo) — open from file:// in Debian's headless Chromium, driven by Playwright,
with every request that leaves the machine blocked. Each must draw its charts (non-empty SVG, canvas or images), and
show no page error and no console error.

The site is the one `nl-embryo docs` built into `_docs/` (CI builds it just before pytest) when that build is the
nbconvert fallback and newer than the three pages' notebooks; otherwise the test builds those three pages itself,
with `build_docs`, in a small project in a temporary folder (same settings, site config and stylesheet). The only
request a page may try to send out is MathJax's loader (it typesets `$…$` when the reader is online); it is blocked
here, and its failed load is the only console error allowed.
"""
import shutil, time
from pathlib import Path

import pytest

from conftest import require_browser

from nl_embryo.docs import build_docs

ROOT = Path(__file__).resolve().parents[1]
LOCAL = ('file:', 'data:', 'blob:', 'about:')
PAGES = {  # page -> (its notebook in nbs/, the fewest charts it must draw)
    'index.html': ('index.ipynb', 2),
    'attention.html': ('08_attention.ipynb', 3),
    'tutorials/first_embryo.html': ('tutorials/first_embryo.ipynb', 4),
}
OPTIONAL = ('mathjax',)   # the only remote script a page may ask for


def _fresh_fallback_site(docs: Path) -> bool:
    "Is `docs` a complete nbconvert-fallback build, newer than the notebooks of PAGES and the docs builder?"
    pages = [docs/p for p in PAGES]
    if not all(p.is_file() for p in pages): return False
    if not all('<nav class="nl-nav">' in p.read_text(encoding='utf-8') for p in pages): return False   # Quarto's site: not offline
    built = min(p.stat().st_mtime for p in pages)
    sources = [ROOT/'nbs'/nb for nb, _ in PAGES.values()] + [ROOT/'nl_embryo'/'docs.py', ROOT/'_quarto.yml']
    return all(s.exists() and s.stat().st_mtime <= built for s in sources)


def _build_pages(tmp: Path) -> Path:
    "Build just the pages of PAGES with `build_docs` in a small copy of the project; returns the site folder."
    proj = tmp/'project'
    for f in ('settings.ini', '_quarto.yml', 'nbs/styles.css', *(f'nbs/{nb}' for nb, _ in PAGES.values())):
        (proj/f).parent.mkdir(parents=True, exist_ok=True); shutil.copy2(ROOT/f, proj/f)
    r = build_docs(out=tmp/'site', root=proj, use_quarto=False, strict=True, readme=False, quiet=True)
    assert sorted(r.pages.values()) == sorted(PAGES), r.pages
    return r.out


@pytest.fixture(scope='module')
def site(tmp_path_factory):
    require_browser()
    docs = ROOT/'_docs'
    return docs if _fresh_fallback_site(docs) else _build_pages(tmp_path_factory.mktemp('docs'))


CHARTS = """() => {
    const big = e => { const r = e.getBoundingClientRect(); return r.width > 50 && r.height > 30; };
    const svgs = [...document.querySelectorAll('svg')].filter(s => !s.parentElement.closest('svg'))
        .filter(s => big(s) && s.querySelectorAll('path, rect, line, text, circle').length > 20).length;
    const imgs = [...document.querySelectorAll('img')].filter(i => i.complete && i.naturalWidth > 50 && big(i)).length;
    const canvases = [...document.querySelectorAll('canvas')].filter(c => c.width > 50 && big(c)).length;
    return {svgs, imgs, canvases};
}"""


@pytest.mark.parametrize('page', list(PAGES))
def test_page_renders_its_charts_offline(site, browser, page):
    t0 = time.time()
    p = browser.new_page(viewport={'width': 1400, 'height': 1000})
    blocked, errors, console = [], [], []
    def route(r):
        if r.request.url.startswith(LOCAL): r.continue_()
        else: blocked.append(r.request.url); r.abort()
    p.route('**/*', route)
    p.on('pageerror', lambda e: errors.append(str(e)))
    p.on('console', lambda m: console.append((m.type, m.text, (m.location or {}).get('url', ''))))
    try:
        p.goto((site/page).as_uri(), wait_until='load', timeout=60_000)
        p.wait_for_timeout(300)
        found = p.evaluate(CHARTS)
        title = p.title()
        links = p.eval_on_selector_all('nav.nl-nav a', 'as => as.map(a => a.getAttribute("href"))')
    finally:
        p.close()
    _, fewest = PAGES[page]
    assert sum(found.values()) >= fewest > 0, f"{page} drew {found}, expected at least {fewest} charts"
    assert errors == [], f"page errors on {page}: {errors}"
    remote = [u for u in blocked if not any(o in u.lower() for o in OPTIONAL)]
    assert remote == [], f"{page} asked for remote resources it needs: {remote}"
    bad = [(t, text) for t, text, url in console if t == 'error' and url not in blocked]
    assert bad == [], f"console errors on {page}: {bad}"
    assert 'nl_embryo' in title
    # the sidebar's links, relative to this page, lead to pages of the site
    targets = [((site/page).parent/h.split('#')[0]).resolve() for h in links if not h.startswith(('http:', 'https:', '#'))]
    assert len(targets) >= 3 and all(t.is_file() for t in targets), [t for t in targets if not t.is_file()]
    assert time.time() - t0 < 90


def test_chapter_page_has_the_api_reference(site):
    "nbdev's show_doc entries of the exported functions are on the chapter's page, with their source links."
    html = (site/'attention.html').read_text(encoding='utf-8')
    for name in ('analyze_attention', 'attention_tables', 'pattern_scores_chart', 'attentionexplorer'):
        assert f'<h3 id="{name}"' in html, name
    assert html.count('>source</a>') >= 10
