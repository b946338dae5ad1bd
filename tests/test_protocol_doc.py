"""docs/protocol.md keeps up with the code, and the repository's docs stand on their own.

The schema, the error tree and the remoting service are the source of truth;
these tests fail when one of them grows something the protocol page does not
describe (an op, a field, an error code, a remoting request code, a limit), and
when anything in the repository points at a contract kept outside it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import msgspec
import pytest

from zns.cli.serve import serve
from zns.core import schema
from zns.core.errors import BY_CODE
from zns.core.remoting import NAMESERVER_REQUEST_CODES, RequestCode

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "protocol.md"
# Spelled in pieces so that this file does not itself mention what it forbids.
OUTSIDE = ("../" + "shared", "/work/" + "shared", "PROTOCOL" + ".md", "REMOTING" + ".md")
OUTSIDE_DOCS = ("PROTOCOL" + ".md", "REMOTING" + ".md", "ZEROMQ-NOTES", "shared" + "/")

REQUESTS = {c.__struct_config__.tag: c for c in schema.AnyRequest.__args__}
EVENTS = {c.__struct_config__.tag: c for c in schema.AnyEvent.__args__}


def _text() -> str:
    return DOC.read_text(encoding="utf-8")


def _sections(text: str) -> dict[str, str]:
    """Heading line -> the text up to the next heading of any level."""
    parts = re.split(r"^(#{1,6} .*)$", text, flags=re.MULTILINE)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def _op_section(op: str, suffix: str = "") -> str:
    heading = f"### `{op}`{suffix}"
    sections = _sections(_text())
    assert heading in sections, f"docs/protocol.md has no heading {heading!r}"
    return sections[heading]


def _fields(struct: type[msgspec.Struct]) -> set[str]:
    return set(struct.__struct_fields__) - {"id"}


def _code_words(section: str) -> set[str]:
    """Identifiers that appear as code in `section`: in fenced blocks or `inline spans`."""
    fenced = re.findall(r"```[a-z]*\n(.*?)```", section, flags=re.DOTALL)
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", section, flags=re.DOTALL))
    return set(re.findall(r"\w+", " ".join(fenced + inline)))


def _table_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


def test_every_known_op_is_a_heading_with_its_fields_and_one_worked_example() -> None:
    assert set(REQUESTS) == schema.KNOWN_OPS
    for op, request in REQUESTS.items():
        section = _op_section(op)
        reply = schema.REPLY_TYPES[op]
        words = _code_words(section)
        for name in sorted(_fields(request) | _fields(reply)):
            assert name in words, f"{op}: field {name!r} is not described"
        examples = re.findall(r"```json\n(.*?)```", section, flags=re.DOTALL)
        assert any(f'"op": "{op}"' in example for example in examples), (
            f"{op}: no worked example (a ```json block with its request and reply)")


def test_every_event_op_is_a_heading_with_its_fields() -> None:
    for op, event in EVENTS.items():
        section = _op_section(op, " events")
        words = _code_words(section)
        for name in sorted(_fields(event)):
            assert name in words, f"{op} event: field {name!r} is not described"
    channels = {schema.route_channel("T"), schema.broker_channel("C", "B"), schema.HB_CHANNEL}
    text = _text()
    for channel in channels:
        shown = channel.decode().replace("\0", "\\0").replace("/T\\0", "/<topic>\\0")
        shown = shown.replace("/C/B\\0", "/<cluster>/<broker_name>\\0")
        assert f"`{shown}`" in text, f"channel {shown!r} is not documented"


def test_every_error_code_is_a_table_row() -> None:
    rows = _table_rows(_text())
    for code in BY_CODE:
        assert any(row.startswith(f"| `{code}` |") for row in rows), f"error code {code!r}"
    assert "all-or-nothing" in _text()


def test_every_remoting_request_code_the_service_answers_is_a_table_row() -> None:
    rows = _table_rows(_sections(_text())["### Request codes answered"])
    for code in sorted(NAMESERVER_REQUEST_CODES):
        name = RequestCode(code).name
        assert any(row.startswith(f"| {code} | {name}") for row in rows), (
            f"remoting request code {code} ({name}) has no row in §12")


def test_every_limit_option_is_documented() -> None:
    text = _text()
    options = [p.opts[0] for p in serve.params if p.name.startswith(("max_", "pub_hwm", "remoting_max"))]
    assert "--max-queues" in options
    for option in options:
        assert f"`{option}`" in text, f"{option} is not in §13"


def test_internal_links_resolve_to_headings() -> None:
    text = _text()
    anchors = {
        re.sub(r"[^\w\- ]", "", heading.lstrip("#").strip().lower()).replace(" ", "-")
        for heading in _sections(text)
    }
    for target in re.findall(r"\]\(#([^)]+)\)", text):
        assert target in anchors, f"link #{target} points to no heading"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for target in re.findall(r"docs/protocol\.md#([^)\s]+)", readme):
        assert target in anchors, f"README links docs/protocol.md#{target}, which is no heading"


def test_section_numbers_cited_in_code_are_headings() -> None:
    """Source comments cite this page as §N: every N must be a numbered section."""
    numbered = {int(m) for m in re.findall(r"^## (\d+)\. ", _text(), flags=re.MULTILINE)}
    cited = set()
    for path in (ROOT / "zns").rglob("*.py"):
        cited |= {int(n) for n in re.findall(r"§ ?(\d+)", path.read_text(encoding="utf-8"))}
    assert cited and cited <= numbered, f"§{sorted(cited - numbered)} cited but not in the page"


def _tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True, timeout=30).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / name for name in out.decode().split("\0") if name]


def test_no_tracked_file_points_outside_the_repository() -> None:
    offenders = []
    for path in _tracked_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        offenders += [f"{path.relative_to(ROOT)}: {word}" for word in OUTSIDE if word in text]
    assert not offenders, offenders


def test_readme_and_docs_name_no_outside_contract_and_readme_links_the_page() -> None:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for path in docs:
        text = path.read_text(encoding="utf-8")
        for word in OUTSIDE_DOCS:
            assert word not in text, f"{path.relative_to(ROOT)} mentions {word}"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    head = readme[: readme.index("## Quick start")]
    assert "(docs/protocol.md)" in head, "the README's opening must link docs/protocol.md"
