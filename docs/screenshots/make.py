"""Remake the screenshots of docs/screenshots/ (docs/service.md, docs/metrics.md).

Builds a small database (SmolLM2-135M on the bundled text; two seeded tiny ViTs, with and
without registers, on images:sample), analyses and reports it, serves it, and shoots with
headless Chromium: a head page with its types, the run page's massive activations, a ViT run
page's high-norm table and rollout, a ViT head page with the rollout beside the pattern; then
the report's new sections from the PDF (pypdfium2 when importable, else Chromium on the HTML
report). Each page is shot with only the named sections shown (the rest hidden by a script in a
local copy of the page), cropped to its content and written as a palette PNG.

Needs ``attnbase`` on PATH (the commands it runs are printed), ``chromium`` and Pillow:

    PATH=/work/venv-team/bin:$PATH python docs/screenshots/make.py [--db DIR] [--port 8793]

It serves on 127.0.0.1 and stops the server it started.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from PIL import Image, ImageChops

OUT = Path(__file__).resolve().parent
CHROMIUM_FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars"]
TEXT_RUN, VIT_REG, VIT_PLAIN = "smol", "vit-dinov2-reg", "vit-plain"
#: The most bytes a screenshot may take; a larger one is scaled down until it fits.
MAX_BYTES = 300_000

# Hides every section of <main> (an <h2> and what follows it up to the next <h2>) whose heading
# does not start with one of KEEP; what precedes the first <h2> stays.
_KEEP_SCRIPT = """<script>
(function () {
  var keep = %s, main = document.querySelector("main") || document.body, show = true;
  Array.prototype.slice.call(main.children).forEach(function (el) {
    if (el.tagName === "H2") {
      var t = el.textContent.replace(/^\\s*[0-9]+\\.\\s*/, "");
      show = keep.some(function (k) { return t.indexOf(k) === 0; });
    }
    if (!show) el.style.display = "none";
  });
})();
</script>"""


def sh(*cmd: str) -> None:
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def build(db: Path) -> None:
    sh("attnbase", "extract", "--db", str(db), "--model", "smollm2-135m", "--corpus", "default",
       "--seqs", "8", "--seq-len", "64", "--run", TEXT_RUN)
    sh("attnbase", "extract", "--db", str(db), "--model", "tiny-dinov2-reg", "--corpus",
       "images:sample", "--seqs", "4", "--run", VIT_REG)
    sh("attnbase", "extract", "--db", str(db), "--model", "tiny-vit", "--corpus",
       "images:sample", "--seqs", "4", "--run", VIT_PLAIN)
    for run in (TEXT_RUN, VIT_REG, VIT_PLAIN):
        sh("attnbase", "analyze", "--db", str(db), "--run", run, "--draws", "20",
           "--gauss-draws", "20", "-q")
    sh("attnbase", "report", "--db", str(db), "--run", TEXT_RUN)
    sh("attnbase", "report", "--db", str(db), "--run", VIT_REG, "--compare", VIT_PLAIN)


def top_head(db: Path, metric: str) -> tuple[int, int]:
    out = subprocess.run(
        ["attnbase", "sql", "--db", str(db), "--format", "csv",
         f"select layer, head from head_metrics where run_id = '{TEXT_RUN}' and metric = "
         f"'{metric}' order by value desc nulls last limit 1"],
        check=True, capture_output=True, text=True).stdout
    layer, head = out.strip().splitlines()[-1].split(",")
    return int(layer), int(head)


def chromium(url: str, png: Path, height: int) -> None:
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(["chromium", *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                        "--virtual-time-budget=3000", f"--screenshot={png}",
                        f"--window-size=1280,{height}", url],
                       check=True, capture_output=True)


def shoot(url: str, keep: list[str], name: str, height: int = 2400) -> Path:
    """``url`` with only the sections in ``keep`` shown, cropped and saved as ``name``.png."""
    html = urllib.request.urlopen(url, timeout=60).read().decode()
    base = re.match(r"(https?://[^/]+)", url).group(1) if url.startswith("http") else None
    if base:
        html = html.replace("<head>", f'<head><base href="{base}/">', 1)
    html = html.replace("</body>", _KEEP_SCRIPT % repr(keep) + "</body>", 1)
    with tempfile.TemporaryDirectory() as tmp:
        page, png = Path(tmp) / "page.html", Path(tmp) / "shot.png"
        page.write_text(html)
        chromium(page.as_uri(), png, height)
        return save(Image.open(png), name)


def save(im: Image.Image, name: str) -> Path:
    """Crop to the content (plus a margin), quantise to 256 colours, shrink to MAX_BYTES."""
    im = im.convert("RGB")
    box = ImageChops.difference(im, Image.new("RGB", im.size, "white")).getbbox()
    if box:
        im = im.crop((0, 0, min(im.width, box[2] + 16), min(im.height, box[3] + 16)))
    out = OUT / f"{name}.png"
    while True:
        im.quantize(256, dither=Image.Dither.NONE).save(out, optimize=True)
        if out.stat().st_size <= MAX_BYTES:
            break
        im = im.resize((int(im.width * 0.85), int(im.height * 0.85)), Image.LANCZOS)
    print(f"wrote {out.relative_to(OUT.parent.parent)} ({im.width}x{im.height}, "
          f"{out.stat().st_size // 1000} KB)")
    return out


def report_pages(db: Path, run: str, sections: dict[str, str]) -> None:
    """For each ``{section title: name}``, the PDF report's page where that section starts."""
    pdf_path = db / "reports" / run / "report.pdf"
    try:
        import pypdfium2 as pdfium
    except ImportError:
        print("pypdfium2 not importable: the HTML report instead of the PDF")
        for title, name in sections.items():
            shoot((db / "reports" / run / "report.html").as_uri(), [title], name, height=4000)
        return
    pdf = pdfium.PdfDocument(str(pdf_path))
    texts = [page.get_textpage().get_text_range() for page in pdf]
    for title, name in sections.items():
        at = [i for i, t in enumerate(texts) if re.search(rf"\d+\. {re.escape(title)}", t)]
        if not at:
            raise SystemExit(f"no section {title!r} in {pdf_path}")
        # the table of contents lists every section too: the section itself is the last match
        save(pdf[at[-1]].render(scale=1.4).to_pil(), name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, help="an existing database (default: a fresh one)")
    ap.add_argument("--port", type=int, default=8793)
    args = ap.parse_args()
    for tool in ("attnbase", "chromium"):
        if shutil.which(tool) is None:
            sys.exit(f"make.py: {tool} is not on PATH")
    tmp = None
    if args.db is None:
        tmp = tempfile.mkdtemp(prefix="attnbase-shots-")
        args.db = Path(tmp) / "db"
        build(args.db)
    url = f"http://127.0.0.1:{args.port}"
    print(f"$ attnbase serve --db {args.db} --port {args.port} --workers 1", flush=True)
    server = subprocess.Popen(["attnbase", "serve", "--db", str(args.db), "--port",
                               str(args.port), "--workers", "1"])
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(url + "/api/runs", timeout=5)
                break
            except OSError:
                time.sleep(1)
        layer, head = top_head(args.db, "induction")
        shoot(f"{url}/runs/{TEXT_RUN}/heads/{layer}/{head}", ["Metrics", "Attention pattern"],
              "head-types")
        shoot(f"{url}/runs/{TEXT_RUN}", ["Massive activations"], "run-massive")
        shoot(f"{url}/runs/{VIT_REG}", ["High-norm patch tokens", "Attention rollout"],
              "vit-run-rollout")
        shoot(f"{url}/runs/{VIT_REG}/heads/1/2", ["Metrics", "Attention pattern"],
              "vit-head-rollout", height=1600)
    finally:
        server.terminate()
        server.wait(30)
    report_pages(args.db, TEXT_RUN, {"Massive activations": "report-massive",
                                     "Sink rate beside": "report-sinks"})
    report_pages(args.db, VIT_REG, {"High-norm patch tokens": "report-high-norm"})
    if tmp:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
