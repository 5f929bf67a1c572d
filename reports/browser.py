"""Look at a rendered report as a person would: headless Chromium opens the HTML file, a screenshot is taken,
and the page is checked for what a reader sees as broken: errors on the console, images that did not load,
tables wider than the page, and `None`, `nan` or `[MISSING]` anywhere in the visible text (collapsed
sections opened first) or in the figures' text.

    python -m reports.browser results/cpu_smoke/report.html --screenshot top.png [--full-page page.png]

exits 1 and lists the problems when there are any.

How Chromium is driven: Debian's `chromium` and `chromium-driver` packages (the same version, installed
together) through Selenium's WebDriver client. WebDriver is the W3C protocol for exactly this; Selenium
reads the console log (`goog:loggingPrefs`), runs the probe in the page and passes a DevTools command
through for the full-page capture, so this module carries no protocol code of its own. Both paths are given
explicitly, so Selenium never looks for (or downloads) a driver. `--dump-dom` and `--screenshot` alone cannot
see console errors or measure the laid-out page; a hand-written DevTools websocket client would be ours to
maintain. The flags are the ones a closed network needs (no first-run, sync, component or background
network traffic).
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

WIDTH, HEIGHT = 1280, 900  # the window: a laptop screen
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--force-device-scale-factor=1")
# Text a reader must never see: a Python None, a float NaN, a placeholder of the paper table
BAD_TEXT = re.compile(r"\bNone\b|\bnan\b|\bNaN\b|\[MISSING\]")

# Runs in the page: opens every <details> (so collapsed tables and figures are checked too), waits for every
# image to decode, then measures; restores the sections as they were before the caller's screenshot.
PROBE = """
const done = arguments[arguments.length - 1];
const details = [...document.querySelectorAll('details')];
const wasOpen = details.map(d => d.open);
details.forEach(d => { d.open = true; });
const images = [...document.images];
Promise.all(images.map(i => i.decode().then(() => null, () => i))).then(failed => {
  const vw = document.documentElement.clientWidth;
  const label = el => {
    let h = el; while (h && !/^H[1-4]$/.test(h.tagName) && h.tagName !== 'SUMMARY') {
      h = h.previousElementSibling || h.parentElement; }
    return h ? h.textContent.trim().slice(0, 80) : '(no heading)';
  };
  const wide = [...document.querySelectorAll('table')]
    .filter(t => { const r = t.getBoundingClientRect(); return r.right > vw + 1 || r.left < -1; })
    .map(t => label(t) + ': ' + Math.round(t.getBoundingClientRect().width) + ' px');
  // the innermost elements past the right edge: what makes a page wider than the window
  // (an element's content may overflow its box, a <pre> say: its scroll width counts)
  const right = e => Math.max(e.getBoundingClientRect().right, e.getBoundingClientRect().left + e.scrollWidth);
  const past = [...document.body.querySelectorAll('*')]
    .filter(e => right(e) > vw + 1 && ![...e.children].some(c => right(c) > vw + 1))
    .slice(0, 5).map(e => e.tagName.toLowerCase() + ': ' + (e.textContent || '').trim().slice(0, 60));
  const broken = images.filter((i, k) => failed[k] || !i.complete || i.naturalWidth === 0)
    .map(i => i.alt || i.src.slice(0, 60));
  const result = {wide: wide, broken: broken, past: past, text: document.body.innerText, viewport: vw,
                  pageWidth: document.documentElement.scrollWidth, pageHeight: document.documentElement.scrollHeight,
                  images: images.length, tables: document.querySelectorAll('table').length};
  details.forEach((d, k) => { d.open = wasOpen[k]; });
  window.scrollTo(0, 0);
  done(result);
});
"""


@dataclass
class Findings:
    console_errors: list[str] = field(default_factory=list)
    broken_images: list[str] = field(default_factory=list)
    wide_tables: list[str] = field(default_factory=list)
    bad_text: list[str] = field(default_factory=list)
    past_the_edge: list[str] = field(default_factory=list)  # elements beyond the window's right edge
    page_width: int = 0
    viewport: int = 0
    images: int = 0
    tables: int = 0
    screenshot: Path | None = None

    @property
    def problems(self) -> list[str]:
        out = [f"console error: {e}" for e in self.console_errors]
        out += [f"image did not load: {i}" for i in self.broken_images]
        out += [f"table wider than the page: {t}" for t in self.wide_tables]
        if self.page_width > self.viewport + 1:
            out.append(f"page wider than the window: {self.page_width} px > {self.viewport} px "
                       f"({'; '.join(self.past_the_edge) or 'no element named'})")
        out += [f"raw value in the page: {t}" for t in self.bad_text]
        return out


def browser_paths() -> tuple[str, str] | str:
    """(chromium, chromedriver) or why they cannot be used. SUPEROFFLOAD_CHROMIUM and
    SUPEROFFLOAD_CHROMEDRIVER name other binaries."""
    chromium = os.environ.get("SUPEROFFLOAD_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    driver = os.environ.get("SUPEROFFLOAD_CHROMEDRIVER") or shutil.which("chromedriver")
    missing = [name for name, path in (("chromium", chromium), ("chromedriver", driver))
               if not path or not os.access(path, os.X_OK)]
    if missing:
        return (f"{' and '.join(missing)} not found (Debian: apt-get install chromium chromium-driver; "
                ".ci/run installs them)")
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    return chromium, driver  # type: ignore[return-value]


def _context_of(text: str, m: re.Match) -> str:
    line_start = text.rfind("\n", 0, m.start()) + 1
    line_end = text.find("\n", m.end())
    line = text[line_start: line_end if line_end >= 0 else len(text)].strip()
    return line if len(line) <= 160 else line[:157] + "..."


SVG_URI = re.compile(r'src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"')
SVG_TEXT = re.compile(r"<text[^>]*>(.*?)</text>", re.S)


def figure_text(html: str) -> list[tuple[int, str]]:
    """(figure index, text) of every text element of the SVG figures embedded in ``html``: what a reader
    sees drawn in them (the figures keep their text as text)."""
    out = []
    for i, m in enumerate(SVG_URI.finditer(html)):
        svg = base64.b64decode(m[1]).decode("utf-8", "replace")
        out += [(i, re.sub(r"<[^>]+>", "", t)) for t in SVG_TEXT.findall(svg)]
    return out


def check(html_path: str | Path, screenshot: str | Path | None = None, full_page: str | Path | None = None,
          width: int = WIDTH, height: int = HEIGHT, timeout_s: float = 60.0) -> Findings:
    """Open ``html_path`` in headless Chromium at ``width`` x ``height``; save a screenshot of the top of the
    page (``screenshot``) and of the whole page with every section open (``full_page``); return what a
    reader would see as broken. RuntimeError when Chromium cannot be driven."""
    paths = browser_paths()
    if isinstance(paths, str):
        raise RuntimeError(paths)
    chromium, driver_path = paths
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    html_path = Path(html_path).resolve()
    with tempfile.TemporaryDirectory(prefix="so-chromium-") as profile:
        opts = webdriver.ChromeOptions()
        opts.binary_location = chromium
        for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
            opts.add_argument(flag)
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        drv = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
        try:
            drv.set_page_load_timeout(timeout_s)
            drv.set_script_timeout(timeout_s)
            drv.set_window_size(width, height)
            drv.get(html_path.as_uri())
            probe = drv.execute_async_script(PROBE)
            found = Findings(page_width=int(probe["pageWidth"]), viewport=int(probe["viewport"]),
                             images=int(probe["images"]), tables=int(probe["tables"]),
                             wide_tables=list(probe["wide"]), broken_images=list(probe["broken"]),
                             past_the_edge=list(probe["past"]))
            found.console_errors = [e.get("message", "") for e in drv.get_log("browser") if e.get("level") == "SEVERE"]
            text = probe["text"]
            found.bad_text = [_context_of(text, m) for m in BAD_TEXT.finditer(text)]
            found.bad_text += [f"figure {i + 1}: {t}" for i, t in figure_text(html_path.read_text())
                               if BAD_TEXT.search(t)]
            if screenshot:
                Path(screenshot).parent.mkdir(parents=True, exist_ok=True)
                drv.save_screenshot(str(screenshot))
                found.screenshot = Path(screenshot)
            if full_page:
                _full_page(drv, Path(full_page), width)
        finally:
            drv.quit()
    return found


def _full_page(drv, out: Path, width: int) -> None:
    """The whole page, every section open, as one PNG (DevTools Page.captureScreenshot beyond the viewport)."""
    drv.execute_script("document.querySelectorAll('details').forEach(d => { d.open = true; });")
    h = int(drv.execute_script("return document.documentElement.scrollHeight"))
    clip = {"x": 0, "y": 0, "width": width, "height": h, "scale": 1}
    shot = drv.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True,
                                                           "clip": clip})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(base64.b64decode(shot["data"]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("html", help="the report (or any HTML file) to open")
    p.add_argument("--screenshot", help="PNG of the top of the page, as a reader first sees it")
    p.add_argument("--full-page", help="PNG of the whole page with every section open")
    p.add_argument("--width", type=int, default=WIDTH)
    p.add_argument("--height", type=int, default=HEIGHT)
    a = p.parse_args(argv)
    try:
        found = check(a.html, a.screenshot, a.full_page, a.width, a.height)
    except RuntimeError as e:
        print(f"browser: {e}", file=sys.stderr)
        return 2
    print(f"{a.html}: {found.tables} tables, {found.images} images, page {found.page_width} px wide "
          f"in a {found.viewport} px window")
    for problem in found.problems:
        print(f"  {problem}")
    return 1 if found.problems else 0


if __name__ == "__main__":
    sys.exit(main())
