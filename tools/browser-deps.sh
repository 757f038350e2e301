#!/usr/bin/env bash
# What the browser tests (tests/test_browser.py) need, installed when missing; safe to run again.
#   - Debian's chromium + chromium-driver (Playwright cannot download a browser here: it drives /usr/bin/chromium)
#   - Playwright (PyPI) and Pillow in .venv (pinned through constraints.txt like every install)
# Then a smoke check: Playwright starts the headless Chromium and renders a page.
#   tools/browser-deps.sh            (VENV=path overrides .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=$VENV/bin/python

if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  echo "browser-deps: installing Debian chromium + chromium-driver"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 || {
    $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q chromium chromium-driver >/dev/null; }
fi

if ! "$PY" -c "import playwright.sync_api, PIL" >/dev/null 2>&1; then
  echo "browser-deps: installing playwright + pillow into $VENV"
  "$PY" -m pip install -q -c constraints.txt playwright pillow
fi

"$PY" - <<'EOF'
from playwright.sync_api import sync_playwright
FLAGS = ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update',
         '--disable-sync', '--no-first-run', '--disable-quic']
with sync_playwright() as p:
    b = p.chromium.launch(executable_path='/usr/bin/chromium', args=FLAGS, headless=True)
    page = b.new_page()
    page.set_content('<p id="x">ok</p>')
    assert page.inner_text('#x') == 'ok'
    print(f"browser-deps: ok (chromium {b.version}, playwright drives it)")
    b.close()
EOF
