"""The README and docs/ hold together: every relative link and image resolves (anchors included),
every docs page is reachable from the README, and the README stays a front door."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 180  # about 150 (issue 55), with room for a tour line or two

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(?!`).+?(?<!`)\1(?!`)", re.DOTALL)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...


def prose(text: str) -> str:
    """The text outside fenced code blocks and code spans (code spans become a placeholder, so a
    link whose text is code, [`x.md`](x.md), still counts)."""
    return CODE_SPAN.sub("code", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text (links and code marks dropped), lowercase,
    punctuation other than hyphens, underscores and spaces removed, spaces -> hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def links(page: Path) -> list[str]:
    """The relative link and image targets of a markdown page."""
    return [target for target in LINK.findall(prose(page.read_text()))
            if not EXTERNAL.match(target) and not target.startswith("//")]


def resolve(page: Path, target: str) -> tuple[Path, str]:
    path, _, anchor = target.partition("#")
    return (page.parent / path).resolve() if path else page.resolve(), anchor


def dead_links(pages: list[Path]) -> list[str]:
    """'page: target (why)' for every relative link of ``pages`` that does not resolve."""
    dead = []
    for page in pages:
        for target in links(page):
            path, anchor = resolve(page, target)
            if not path.exists():
                dead.append(f"{page}: {target} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                dead.append(f"{page}: {target} (no heading #{anchor})")
    return dead


def reachable(start: Path) -> set[Path]:
    """Every markdown page reachable from ``start`` by relative links (a folder means its README.md)."""
    seen, todo = set(), [start.resolve()]
    while todo:
        page = todo.pop()
        if page in seen:
            continue
        seen.add(page)
        for target in links(page):
            path, _ = resolve(page, target)
            if path.is_dir():
                path = path / "README.md"
            if path.suffix == ".md" and path.is_file():
                todo.append(path)
    return seen


def markdown_pages(root: Path) -> list[Path]:
    return [root / "README.md"] + sorted((root / "docs").rglob("*.md"))


def test_every_relative_link_resolves():
    pages = markdown_pages(ROOT)
    assert len(pages) > 10 and sum(len(links(page)) for page in pages) > 30  # the check is real
    assert dead_links(pages) == []


def test_every_docs_page_is_reachable_from_the_readme():
    found = reachable(ROOT / "README.md")
    pages = sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "docs" / "study").glob("*.md"))
    assert len(pages) > 15  # the study's pages are among them
    missing = [str(page.relative_to(ROOT)) for page in pages if page.resolve() not in found]
    assert missing == []


def test_the_readme_stays_short():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move details to a page in docs/"


def test_the_checker_finds_dead_links_and_anchors(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "# Top\n[ok](docs/a.md#a-page-with-code) [gone](docs/missing.md) ![img](pic.png)\n"
        "[web](https://example.com/x) [mail](mailto:a@b.c) [here](#top) [bad anchor](docs/a.md#nope)\n"
        "```\n[in code](docs/also-missing.md)\n```\n`[span](docs/span-missing.md)`\n")
    (tmp_path / "docs" / "a.md").write_text("# A page, with `code`!\n[back](../README.md)\n")
    (tmp_path / "docs" / "orphan.md").write_text("# Orphan\n")
    dead = dead_links(markdown_pages(tmp_path))
    assert [entry.split(": ", 1)[1] for entry in dead] == [
        "docs/missing.md (no such file)", "pic.png (no such file)", "docs/a.md#nope (no heading #nope)"]
    found = reachable(tmp_path / "README.md")
    assert (tmp_path / "docs" / "a.md").resolve() in found
    assert (tmp_path / "docs" / "orphan.md").resolve() not in found


def test_slugs_follow_githubs_rule():
    assert slug("Low-rank noise: the whole population in one generation (`--noise lowrank`)") == \
        "low-rank-noise-the-whole-population-in-one-generation---noise-lowrank"
    assert slug("Openings of the assistant's turn") == "openings-of-the-assistants-turn"
    assert slug("`trainers.sweep`: selection on validation") == "trainerssweep-selection-on-validation"


def test_the_docs_name_every_multi_turn_env():
    """Where a page lists the multi-turn envs, it lists all of them (they were said to be three)."""
    import llm_envs
    from llm_envs.multiturn import MultiTurnEnv
    from llm_envs.registry import env_class

    multi = [i for i in llm_envs.ENV_IDS if issubclass(env_class(i), MultiTurnEnv)
             and env_class(i).__module__.startswith("llm_envs.")]  # not the tests' own
    assert len(multi) == 4
    for page in (ROOT / "README.md", ROOT / "docs" / "environments.md", ROOT / "docs" / "es.md", ROOT / "docs" / "rl.md"):
        text = page.read_text()
        assert all(env_id in text for env_id in multi), page
        assert not re.search(r"(three|3) multi-turn|all three envs", text), page
    assert "four multi-turn" in (ROOT / "docs" / "environments.md").read_text()
    assert "five environments" not in (ROOT / "docs" / "README.md").read_text()
