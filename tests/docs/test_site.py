"""The docs as a site: `mkdocs build --strict` passes (a broken link or anchor fails it), every page is in the
navigation, and the README stays a front door whose links lead to pages that exist."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from runner.store.metrics import Filters

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _build(root: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=root,
                          capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
                          timeout=300)


def _nav_pages(nav: list) -> list[str]:
    pages = []
    for entry in nav:
        target = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += _nav_pages(target) if isinstance(target, list) else [target]
    return pages


def test_the_site_builds_strictly(tmp_path):
    built = _build(ROOT, tmp_path / "site")
    assert built.returncode == 0, built.stderr[-2000:]
    assert (tmp_path / "site" / "drafters" / "index.html").is_file()


def test_a_broken_anchor_fails_the_build(tmp_path):
    shutil.copytree(DOCS, tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    page = tmp_path / "docs" / "batches.md"
    page.write_text(page.read_text() + "\nSee [the advisor](policies.md#no-such-section).\n")
    built = _build(tmp_path, tmp_path / "site")
    assert built.returncode != 0
    assert "no-such-section" in built.stderr


def test_every_page_is_in_the_navigation_once():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    listed = _nav_pages(config["nav"])
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(listed) == pages


def test_the_readme_is_a_front_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    for command in ("make run", "make test", "make docs"):
        assert command in readme
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    local = [link for link in links if not link.startswith("http")]
    assert "docs/img/overview.png" in local
    assert [link for link in local if not (ROOT / link).exists()] == []


def test_the_readme_answers_which_draft_which_k_with_a_page_that_exists():
    """The tour's first step opens the Compare page with the category picked: the page's url_path is the app's and
    `category` is one of the sidebar filters the URL carries."""
    readme = (ROOT / "README.md").read_text()
    tour = readme[readme.index("## A five-minute tour"):]
    assert tour.index("Which draft, which k for my summaries?") < tour.index("**2.")
    url = re.search(r"http://localhost:8501/(\w+)\?category=summary", tour)
    assert url is not None
    assert f'url_path="{url[1]}"' in (ROOT / "dashboard" / "app.py").read_text()
    assert "category" in Filters.__dataclass_fields__
