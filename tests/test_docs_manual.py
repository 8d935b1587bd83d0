"""The documentation reads as a manual (docs/README.md): README.md, docs/*.md
and the Markdown under bench/results/ say nothing about where or in which
round of work they were written, point at no path outside the repository, and
every image in docs/img/ is shown by some page and exists where a page shows it.

Rules, one case per file:

- no "this machine", "development VM", "dev VM", and no session ordinal
  ("first session", "(fourth session)", "a later session", ...): a result names
  its hardware in its results README instead;
- no "../shared" and no "/work/" anywhere (paths of a checkout, not of the
  repository); "/tmp/" only inside code (a fenced block or an inline code span:
  commands that make scratch files), never in prose;
- no relative link or image that resolves outside the repository;
- every image a page shows and every file a page links exists;
- every docs/img/*.png is shown by at least one of these pages.
"""
import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMG_DIR = os.path.join(ROOT, "docs", "img")


def pages():
    found = [os.path.join(ROOT, "README.md")]
    found += glob.glob(os.path.join(ROOT, "docs", "*.md"))
    found += glob.glob(os.path.join(ROOT, "bench", "results", "**", "*.md"), recursive=True)
    return sorted(p for p in found if os.path.isfile(p))


def rel(path):
    return os.path.relpath(path, ROOT)


PHRASES = re.compile(r"this machine|development VM|\bdev VM\b", re.IGNORECASE)
ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
            r"\d+(?:st|nd|rd|th)|this|that|later|earlier|previous|next|last|same")
SESSION = re.compile(r"\b(?:%s)\s+session\b" % ORDINALS, re.IGNORECASE)
OUTSIDE = re.compile(r"\.\./shared\b|/work/")
TMP = re.compile(r"/tmp/")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target) and ![alt](target), target up to a space or ')'; <img src="...">.
LINK = re.compile(r"(!?)\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
IMG_TAG = re.compile(r"<img\b[^>]*\bsrc=[\"']([^\"']+)[\"']", re.IGNORECASE)


def prose_lines(text):
    """(line number, text outside code) for every line; code spans and fenced
    blocks are blanked."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            out.append((n, ""))
            continue
        out.append((n, "" if fenced else INLINE_CODE.sub("``", line)))
    return out


def targets(text):
    """(is image, target) of every local link and image of a page."""
    found = [(bool(m.group(1)), m.group(2)) for m in LINK.finditer(text)]
    found += [(True, m.group(1)) for m in IMG_TAG.finditer(text)]
    return [(img, t) for img, t in found
            if not re.match(r"[a-z][a-z0-9+.-]*:", t, re.IGNORECASE) and not t.startswith("#")]


def resolve(page, target):
    path = target.split("#", 1)[0].split("?", 1)[0]
    return os.path.normpath(os.path.join(os.path.dirname(page), path))


def problems(page, root=ROOT):
    text = open(page, encoding="utf-8").read()
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        for pattern, why in ((PHRASES, "says where it was written"),
                             (SESSION, "names a round of work"),
                             (OUTSIDE, "names a path outside the repository")):
            m = pattern.search(line)
            if m:
                found.append("%s:%d: %r %s" % (rel(page), n, m.group(0), why))
    for n, line in prose_lines(text):
        if TMP.search(line):
            found.append("%s:%d: /tmp/ in prose (only commands may use it)" % (rel(page), n))
    for is_image, target in targets(text):
        path = resolve(page, target)
        if os.path.commonpath([path, root]) != root:
            found.append("%s: %s leads outside the repository" % (rel(page), target))
        elif not os.path.exists(path):
            found.append("%s: %s %s does not exist" % (rel(page), "image" if is_image else "link", target))
    return found


@pytest.mark.parametrize("page", pages(), ids=rel)
def test_page_reads_as_a_manual(page):
    assert problems(page) == []


def shown_images():
    shown = set()
    for page in pages():
        for is_image, target in targets(open(page, encoding="utf-8").read()):
            if is_image:
                shown.add(resolve(page, target))
    return shown


@pytest.mark.parametrize("image", sorted(glob.glob(os.path.join(IMG_DIR, "*.png"))), ids=rel)
def test_image_is_shown_by_a_page(image):
    assert os.path.normpath(image) in shown_images(), \
        "%s is shown by no page of README.md, docs/ or bench/results/: show it or delete it" % rel(image)


def test_the_rules_catch_what_they_are_for(tmp_path):
    """The checks themselves: each rule fires on a line written to break it."""
    page = tmp_path / "page.md"
    page.write_text("Measured on this machine.\n"
                    "# Results (fourth session)\n"
                    "See ../shared/compat/run.sh.\n"
                    "Files go to /tmp/x in prose.\n"
                    "```\nHVDLITE_TIMELINE=/tmp/tl.json hvdrun -np 2 python train.py\n```\n"
                    "`/tmp/ok` in a code span.\n"
                    "![plot](missing.png)\n")
    found = "\n".join(problems(str(page), root=str(tmp_path)))
    assert "'this machine'" in found and "fourth session" in found and "../shared" in found
    assert found.count("/tmp/ in prose") == 1 and "missing.png does not exist" in found
