"""The documentation site builds with ``mkdocs build --strict``: no broken link or anchor, no
page left out of the nav, no README section or API name that no longer exists, and the API
reference shows the public functions with their signatures.

The site is built offline (no web fonts, no CDN; a proxy that refuses every request) and
without torch (mkdocstrings reads the source statically; a `torch` that cannot be imported
stands first on the path). Needs the docs packages (in the ``docs`` and ``dev`` extras).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import ember

for _module, _package in (("mkdocs", "mkdocs"), ("material", "mkdocs-material"),
                          ("mkdocstrings_handlers.python", "mkdocstrings[python]")):
    pytest.importorskip(_module, reason=f"the docs site needs {_package}: pip install -e '.[docs]'")

ROOT = Path(__file__).resolve().parent.parent

# What the API reference must show: everything `import ember` offers (a light import: the API
# itself loads on first use), each function with its heading and signature.
PUBLIC = sorted(set(ember.__all__) - {"__version__"})


def build(config: Path, out: Path) -> subprocess.CompletedProcess:
    # The reference is read from the source: a `torch` that cannot be imported stands first on the path.
    no_torch = out.parent / f"{out.name}-no-torch"
    (no_torch / "torch").mkdir(parents=True, exist_ok=True)
    (no_torch / "torch" / "__init__.py").write_text("raise ImportError('the docs build imported torch')\n")
    path = os.pathsep.join(filter(None, [str(no_torch), os.environ.get("PYTHONPATH", "")]))
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": path,
           # nothing may be fetched: a request through these proxies fails at once
           "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9", "NO_PROXY": ""}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(out)], cwd=config.parent, env=env, capture_output=True, text=True,
                          timeout=300)


def text_of(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html)).replace("&gt;", ">").replace("&#39;", "'")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = build(ROOT / "mkdocs.yml", out)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr[-4000:]}"
    return out


def test_every_page_is_built(site):
    for page in sorted((ROOT / "docs").rglob("*.md")):
        page = page.relative_to(ROOT / "docs")
        assert (site / page.with_suffix(".html")).is_file(), f"docs/{page} was not built"


def test_api_reference_shows_the_public_functions(site):
    reference = text_of((site / "reference" / "api.html").read_text(encoding="utf-8"))
    for name in PUBLIC:
        if name[0].isupper():  # a class: its heading (Model, RunResult)
            assert re.search(rf"\b{name}( dataclass)? ?&para;", reference), f"the API reference lost ember.{name}"
            continue
        assert f"ember.{name}" in reference, f"the API reference lost ember.{name}"
        assert re.search(rf"\b{name}\( ?\w", reference), f"the API reference shows no signature of ember.{name}"
    assert "finetune(task: str | list = '', out: str | Path | None = None" in reference  # task, or tasks= (multi-task)
    assert "classify" in reference and "to_hf(path" in reference  # Model's inference methods and its own


def test_config_reference_shows_the_fields_and_their_comments(site):
    config = text_of((site / "reference" / "config.html").read_text(encoding="utf-8"))
    for section in ("RunConfig", "ModelConfig", "DataConfig", "TrainConfig", "TaskConfig"):
        assert section in config
    # a field, its type, its comment and its default
    assert "max_time" in config and "seconds of training-step time on" in config and "Default: 0.0" in config


def test_pages_come_from_the_readme_and_load_nothing_from_elsewhere(site):
    home = (site / "index.html").read_text(encoding="utf-8")
    assert "ember quickstart" in home  # the README's two commands, included
    for page in site.rglob("*.html"):
        html = page.read_text(encoding="utf-8")
        assert not re.search(r"""(src|href)=["']https?://[^"']*(fonts\.|googleapis|gstatic|cdn|unpkg)""", html), \
            f"{page.relative_to(site)} loads something from the network"


# damage: [(file it goes in, text appended, what the error names)]. The warnings (links, anchors,
# the nav) are all reported before --strict aborts, so one build checks them together; an unknown
# API name stops the build at once, so it has its own.
DEFECTS = {
    "broken link, broken anchor, page left out of the nav": [
        ("data.md", "\nSee [a page that is not there](no-such-page.md).\n", "no-such-page.md"),
        ("data.md", "\nSee [a section that is not there](finetuning.md#no-such-section).\n", "no-such-section"),
        ("orphan.md", "# A page no one can reach\n", "orphan.md")],
    "missing API name": [("data.md", "\n::: ember.no_such_function\n", "no_such_function")],
}


@pytest.mark.parametrize("damage", list(DEFECTS))
def test_a_broken_site_fails_to_build(tmp_path, damage):
    """--strict really fails: a copy of the site with these defects does not build, and says why
    (the copy without an API name leaves the reference pages out, which makes it quicker)."""
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "README.md", copy)
    (copy / "ember").symlink_to(ROOT / "ember", target_is_directory=True)
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    if damage != "missing API name":
        shutil.rmtree(copy / "docs" / "reference")
        config = "\n".join(line for line in config.splitlines() if "reference/" not in line)
    (copy / "mkdocs.yml").write_text(config, encoding="utf-8")
    for name, text, _ in DEFECTS[damage]:
        page = copy / "docs" / name
        page.write_text((page.read_text(encoding="utf-8") if page.exists() else "") + text, encoding="utf-8")
    result = build(copy / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0, f"a site with a {damage} built"
    for _, _, named in DEFECTS[damage]:
        assert named in result.stderr, f"the build did not name {named}:\n{result.stderr[-2000:]}"
