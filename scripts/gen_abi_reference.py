#!/usr/bin/env python3
"""Writes docs/abi-reference.md from the comments of devkit/abi/devkit.h.

    python3 scripts/gen_abi_reference.py           # rewrite the reference
    python3 scripts/gen_abi_reference.py --check   # exit 1 when it is stale (CI)

The header is the single source of truth; the reference lays its comments out
for reading: the rules at its top, then every constant, enum, struct, type
and DK_DeviceApi function, section by section, with anchors to link to. A
construct the parser does not know is an error rather than a gap in the
reference.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEADER = ROOT / "devkit" / "abi" / "devkit.h"
OUTPUT = ROOT / "docs" / "abi-reference.md"
API = "DK_DeviceApi"


class HeaderError(Exception):
    """The header holds something this script cannot document."""


@dataclasses.dataclass
class Member:
    """An enumerator, a struct field or a DK_DeviceApi function."""

    name: str
    code: str
    doc: str
    value: str = ""


@dataclasses.dataclass
class Group:
    """A "--- Title ---" part of DK_DeviceApi."""

    title: str
    optional: bool
    intro: str = ""
    members: list[Member] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Entity:
    kind: str  # "enum", "struct", "type", "callback", "function" or "constants"
    name: str
    code: str
    doc: str
    members: list[Member] = dataclasses.field(default_factory=list)
    groups: list[Group] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Section:
    title: str
    intro: str
    items: list[Entity | str] = dataclasses.field(default_factory=list)  # str: a loose comment


# -- reading the header ------------------------------------------------------------------


def comment_text(comment: str) -> str:
    """The text of a /* ... */ comment, without its frame, dedented."""
    lines = comment.removeprefix("/*").removesuffix("*/").splitlines()
    lines = [re.sub(r"^\s*\*(?!/)", "", line) if i else line for i, line in enumerate(lines)]
    return textwrap.dedent("\n".join(line.rstrip() for line in lines)).strip("\n")


def one_line(text: str) -> str:
    return " ".join(text.split())


_BANNER = re.compile(r"/\*\s*-{20,}\s*\n.*?\n\s*\*\s*-{20,}\s*\*/", re.S)
_RULES_HEADING = re.compile(r"^={20,}\n([A-Z ]+)\n={20,}$", re.M)


def split_top_comment(text: str) -> tuple[str, list[tuple[str, str]], str]:
    """(the header's top comment's intro, its (title, text) rules, the rest of the header)."""
    match = re.match(r"\s*(/\*.*?\*/)", text, re.S)
    if not match:
        raise HeaderError("the header does not start with its rules comment")
    parts = _RULES_HEADING.split(comment_text(match.group(1)))
    rules = [(parts[i].strip().capitalize(), textwrap.dedent(parts[i + 1]).strip())
             for i in range(1, len(parts), 2)]
    if not rules:
        raise HeaderError("the header's top comment has no ==== RULES ==== sections")
    return parts[0].strip(), rules, text[match.end():]


def strip_preprocessor(body: str) -> tuple[str, list[tuple[str, str]]]:
    """Empties the preprocessor lines and the conditional blocks (build
    plumbing: extern "C", DK_EXPORT); returns what is left and the integer
    constants defined outside the blocks."""
    lines = body.split("\n")
    constants = []
    guard = None
    depth = 0
    for i, line in enumerate(lines):
        directive = re.match(r"\s*#\s*(\w+)\s*(.*)", line)
        if depth:
            if directive and directive.group(1).startswith("if"):
                depth += 1
            elif directive and directive.group(1) == "endif":
                depth -= 1
            lines[i] = ""
            continue
        if not directive:
            continue
        keyword, rest = directive.groups()
        lines[i] = ""
        if keyword == "ifndef" and guard is None:
            guard = rest.strip()
        elif (keyword == "define" and rest.strip() == guard) or keyword == "include":
            pass
        elif keyword == "define" and re.fullmatch(r"(\w+)\s+(-?\d+)", rest.strip()):
            constants.append(tuple(rest.split()))
        elif keyword.startswith("if"):
            depth = 1
        elif keyword == "endif":
            pass  # the include guard's
        else:
            raise HeaderError(f"devkit.h: cannot document the directive '{line.strip()}'")
    return "\n".join(lines), constants


@dataclasses.dataclass
class Token:
    kind: str  # "comment" or "code"
    text: str
    after_blank_line: bool
    trails_code: bool  # a comment on the line where a declaration ends


def _comment_end(text: str, start: int) -> int:
    end = text.find("*/", start + 2)
    if end < 0:
        raise HeaderError("devkit.h: a comment is not closed")
    return end + 2


def tokens(body: str) -> list[Token]:
    """Top-level comments, and declarations through their ';' (comments inside included)."""
    out = []
    position = 0
    while True:
        start = len(body[position:]) - len(body[position:].lstrip()) + position
        if start == len(body):
            return out
        gap = body[position:start]
        if body.startswith("/*", start):
            end = _comment_end(body, start)
            kind = "comment"
        else:
            end, depth = start, 0
            while body[end] != ";" or depth:
                if body.startswith("/*", end):
                    end = _comment_end(body, end)
                    continue
                depth += {"{": 1, "}": -1}.get(body[end], 0)
                end += 1
                if end == len(body):
                    raise HeaderError(f"devkit.h: declaration without ';': {body[start:start + 60]!r}")
            end += 1
            kind = "code"
        trails = kind == "comment" and "\n" not in gap and bool(out) and out[-1].kind == "code"
        out.append(Token(kind, body[start:end], gap.count("\n") >= 2, trails))
        position = end


def body_members(body: str, separator: str) -> list[tuple[list[str], str, list[str]]]:
    """(comments above, code, comments on its line) for each member of an
    enum or struct body. A comment belongs to the member on whose line it is,
    else to the member below it."""
    members = []
    above: list[str] = []
    code = ""
    beside: list[str] = []
    ended = None  # the member that ended on the current line
    i = 0
    while i < len(body):
        if body.startswith("/*", i):
            end = _comment_end(body, i)
            comment = body[i:end]
            if code.strip():
                beside.append(comment)
            elif ended is not None:
                ended[2].append(comment)
            else:
                above.append(comment)
            i = end
            continue
        char = body[i]
        if char == "\n":
            ended = None
        if char == separator and code.count("(") == code.count(")"):
            ended = (above, code, beside)
            members.append(ended)
            above, code, beside = [], "", []
        else:
            code += char
        i += 1
    if code.strip():
        members.append((above, code, beside))
    elif above:
        raise HeaderError(f"devkit.h: a comment ends a struct or enum body: {one_line(above[0])[:60]!r}")
    return members


def _doc(comments: list[str]) -> str:
    return one_line(" ".join(comment_text(c) for c in comments))


def _field_name(code: str) -> str:
    pointer = re.search(r"\(\s*\*\s*(\w+)\s*\)", code)
    if pointer:
        return pointer.group(1)
    return re.search(r"(\w+)\s*(?:\[[^\]]*\])?\s*$", code).group(1)


def _api_groups(members) -> tuple[list[Member], list[Group]]:
    fields, groups = [], []
    for above, code, beside in members:
        docs = []
        for comment in above:
            heading = re.fullmatch(r"/\*\s*-+\s*(.*?)\s*-*\s*\*/", comment)
            if heading:
                title = heading.group(1)
                name = title.removeprefix("OPTIONAL:").strip()
                groups.append(Group(name[:1].upper() + name[1:], title.startswith("OPTIONAL")))
            else:
                docs.append(comment)
        if docs[:-1] and groups:  # comments above the member's own: the group's introduction
            groups[-1].intro = _doc(docs[:-1])
        member = Member(_field_name(code), one_line(code), _doc(docs[-1:] + beside))
        (groups[-1].members if groups else fields).append(member)
    return fields, groups


def entity(code: str, doc: str) -> Entity:
    text = one_line(re.sub(r"/\*.*?\*/", " ", code, flags=re.S))
    enum = re.match(r"enum (\w+) \{", code)
    struct = re.match(r"typedef struct (\w+) \{", code)
    if enum:
        members = []
        for above, value_code, beside in body_members(code[code.index("{") + 1:code.rindex("}")], ","):
            name, _, value = one_line(value_code).partition(" = ")
            members.append(Member(name, one_line(value_code), _doc(above + beside), value))
        return Entity("enum", enum.group(1), text, doc, members)
    if struct:
        members = body_members(code[code.index("{") + 1:code.rindex("}")], ";")
        if struct.group(1) == API:
            fields, groups = _api_groups(members)
            return Entity("struct", API, text, doc, fields, groups)
        fields = [Member(_field_name(c), one_line(c), _doc(above + beside)) for above, c, beside in members]
        return Entity("struct", struct.group(1), text, doc, fields)
    if text.startswith("typedef") and "(*" in text:
        return Entity("callback", _field_name(text[:text.index(")") + 1]), text, doc)
    if text.startswith("typedef"):
        return Entity("type", _field_name(text.rstrip(";")), text, doc)
    function = re.fullmatch(r"DK_EXPORT [\w ]+?\b(\w+)\(.*\);", text)
    if function:
        return Entity("function", function.group(1), text, doc)
    raise HeaderError(f"devkit.h: cannot document the declaration {text[:70]!r}")


def parse(header: str) -> tuple[str, list[tuple[str, str]], list[Section]]:
    """(intro, rules, sections) of the header."""
    intro, rules, body = split_top_comment(header)
    body, constants = strip_preprocessor(body)
    version = Section("ABI version", "")
    if constants:
        version.items.append(Entity("constants", "constants", "", "",
                                    [Member(name, f"#define {name} {value}", "", value)
                                     for name, value in constants]))
    sections = [version]
    pending: list[Token] = []  # comments not yet placed
    for token in tokens(body):
        if token.kind == "comment" and _BANNER.fullmatch(token.text):
            sections[-1].items.extend(comment_text(c.text) for c in pending)
            pending = []
            sections.append(banner_section(comment_text(token.text)))
        elif token.trails_code:
            last = sections[-1].items[-1]  # the entity of that declaration
            last.doc = one_line(f"{last.doc} {comment_text(token.text)}")
        elif token.kind == "comment":
            pending.append(token)
        else:
            # The comment right above a declaration documents it; ones a blank line
            # away stand on their own.
            attached = pending[-1:] if pending and not token.after_blank_line else []
            sections[-1].items.extend(comment_text(c.text) for c in pending[:len(pending) - len(attached)])
            sections[-1].items.append(entity(token.text, _doc([c.text for c in attached])))
            pending = []
    sections[-1].items.extend(comment_text(c.text) for c in pending)
    return intro, rules, [s for s in sections if s.items]


def banner_section(text: str) -> Section:
    """A "----" banner: its first phrase is the title, the rest the introduction."""
    text = one_line(re.sub(r"^-+$", "", text, flags=re.M))
    title = re.match(r"[^.(]*", text).group(0).strip()
    return Section(title, text[len(title):].removeprefix(".").strip())


# -- writing Markdown ----------------------------------------------------------------------


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9_]+", "-", text.lower()).strip("-")


class Writer:
    def __init__(self, rules: list[tuple[str, str]], sections: list[Section]):
        self.rules = {title.upper(): slug(title) for title, _ in rules}
        self.anchors: dict[str, str] = {}
        self.api_functions: set[str] = set()
        for section in sections:
            for item in section.items:
                if not isinstance(item, Entity):
                    continue
                anchor = slug(section.title) if item.kind == "constants" else slug(item.name)
                if item.kind in ("enum", "constants"):
                    self.anchors.update((member.name, anchor) for member in item.members)
                if item.kind != "constants":
                    self.anchors.setdefault(item.name, anchor)
                for group in item.groups:
                    for member in group.members:
                        self.api_functions.add(member.name)
                        self.anchors[member.name] = f"{slug(API)}-{member.name}"

    def prose(self, text: str, table: bool = False) -> str:
        """Escapes Markdown in comment text and marks up identifiers (linked
        where the reference documents them), leaving `code spans` alone."""
        parts = re.split(r"(`[^`\n]*`)", text)
        for i in range(0, len(parts), 2):
            part = parts[i].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            part = re.sub(r"([*\[\]])", r"\\\1", part)
            if table:
                part = part.replace("|", r"\|")
            part = re.sub(r"\b(?:DK_\w+|[A-Za-z]\w*_\w+|_\w+)\b(?:\(\))?", self.identifier, part)
            # "VERSIONING rule 4" and the like refer to the rules above.
            parts[i] = re.sub(r"\b(?:%s)\b" % "|".join(self.rules),
                              lambda m: f"[{m.group(0)}](#{self.rules[m.group(0)]})", part)
        return "".join(parts)

    def identifier(self, match: re.Match) -> str:
        text = match.group(0)
        name = text.removesuffix("()")
        # Only DK_ names and API functions are linked: a parameter may share a
        # struct field's name, and English words ("send") stay words.
        if name in self.anchors and (name.startswith("DK_") or name in self.api_functions):
            return f"[`{text}`](#{self.anchors[name]})"
        return f"`{text}`"

    @staticmethod
    def code(text: str) -> str:
        return f"`{text}`".replace("|", r"\|")


def heading(level: int, anchor: str, text: str) -> str:
    return f"{'#' * level} <a id=\"{anchor}\"></a>{text}\n"


def enum_value(value: str) -> str:
    """The header's value, with the number it comes to when it is an expression."""
    if re.fullmatch(r"[\d\s()|<>]+", value) and not value.strip().isdigit():
        # Integers, shifts, ors and parentheses only: nothing else can run.
        return f"`{value}` = {eval(value, {'__builtins__': {}})}".replace("|", r"\|")
    return f"`{value}`"


def render(header: str, source: str) -> str:
    intro, rules, sections = parse(header)
    writer = Writer(rules, sections)
    out = [
        "# devkit ABI reference\n",
        f"Generated from `{source}` by `scripts/gen_abi_reference.py`: edit the header's comments, "
        "not this file.\n",
        "\n\n".join(writer.prose(paragraph) for paragraph in intro.split("\n\n")) + "\n",
        "## Contents\n",
        "- [Rules](#rules): " + ", ".join(f"[{title}](#{slug(title)})" for title, _ in rules),
    ]
    for section in sections:
        names = [f"[`{item.name}`](#{slug(item.name)})" for item in section.items
                 if isinstance(item, Entity) and item.kind != "constants"]
        contents = f"- [{section.title}](#{slug(section.title)})"
        out.append(f"{contents}: {', '.join(names)}" if names else contents)
    out.append("")
    out.append(heading(2, "rules", "Rules"))
    for title, text in rules:
        out.append(heading(3, slug(title), title))
        out.append("\n".join(writer.prose(line) for line in text.splitlines()) + "\n")
    for section in sections:
        out.append(heading(2, slug(section.title), writer.prose(section.title)))
        if section.intro:
            out.append(writer.prose(section.intro) + "\n")
        for item in section.items:
            out.extend(render_item(writer, item) if isinstance(item, Entity) else [writer.prose(item) + "\n"])
    text = "\n".join(out).rstrip("\n") + "\n"
    anchors = re.findall(r'<a id="([^"]+)">', text)
    duplicates = sorted({a for a in anchors if anchors.count(a) > 1})
    if duplicates:
        raise HeaderError(f"devkit.h: two entries would share the anchors {', '.join(duplicates)}")
    return text


def render_item(writer: Writer, item: Entity) -> list[str]:
    if item.kind == "constants":
        rows = [f"| {writer.code(m.name)} | {writer.code(m.value)} |" for m in item.members]
        return ["| constant | value |", "| --- | --- |", *rows, ""]
    kind = {"enum": "enum ", "struct": "struct "}.get(item.kind, "")
    out = [heading(3, slug(item.name), f"{kind}`{item.name}`")]
    if item.kind in ("type", "callback", "function"):
        out.append(f"```c\n{item.code}\n```\n")
    if item.doc:
        out.append(writer.prose(item.doc) + "\n")
    if item.kind == "enum":
        out += ["| name | value | meaning |", "| --- | --- | --- |"]
        out += [f"| {writer.code(m.name)} | {enum_value(m.value)} | {writer.prose(m.doc, table=True)} |"
                for m in item.members]
        out.append("")
    elif item.kind == "struct" and item.members:
        out += ["| field | declaration | meaning |", "| --- | --- | --- |"]
        out += [f"| {writer.code(m.name)} | {writer.code(m.code)} | {writer.prose(m.doc, table=True)} |"
                for m in item.members]
        out.append("")
    if item.groups:
        out += render_api(writer, item.groups)
    return out


def render_api(writer: Writer, groups: list[Group]) -> list[str]:
    out = ["| function | | summary |", "| --- | --- | --- |"]
    for group in groups:
        for m in group.members:
            summary = re.match(r".*?(?:\.(?=\s|$)|$)", m.doc).group(0)  # the first sentence
            status = "optional" if group.optional else "required"
            out.append(f"| [`{m.name}`](#{writer.anchors[m.name]}) | {status} | "
                       f"{writer.prose(summary, table=True)} |")
    out.append("")
    for group in groups:
        title = f"{group.title} (optional)" if group.optional else group.title
        out.append(heading(4, f"{slug(API)}-{slug(group.title)}", writer.prose(title)))
        if group.intro:
            out.append(writer.prose(group.intro) + "\n")
        for m in group.members:
            status = "optional: may be NULL" if group.optional else "required"
            out.append(heading(5, writer.anchors[m.name], f"`{m.name}` ({status})"))
            out.append(f"```c\n{m.code};\n```\n")
            if m.doc:
                out.append(writer.prose(m.doc) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when the reference is not what the header gives")
    parser.add_argument("--output", type=Path, default=OUTPUT, help="the reference (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        text = render(HEADER.read_text(), str(HEADER.relative_to(ROOT)))
    except HeaderError as exc:
        print(f"gen_abi_reference: {exc}", file=sys.stderr)
        return 2
    if not args.check:
        args.output.write_text(text)
        return 0
    current = args.output.read_text() if args.output.exists() else ""
    if current == text:
        return 0
    diff = difflib.unified_diff(current.splitlines(), text.splitlines(), str(args.output), "generated",
                                lineterm="", n=1)
    print(f"{args.output} is stale: it is not what {HEADER.relative_to(ROOT)} gives. Run "
          f"python3 scripts/gen_abi_reference.py and commit the result.\n" + "\n".join(list(diff)[:40]),
          file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
