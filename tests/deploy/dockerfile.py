"""A small Dockerfile reader: stages, instructions, ARG defaults, and the pip installs in RUN.

Enough of the Dockerfile syntax for the images in images/: comments, line continuations,
global ARGs with defaults substituted into FROM, `FROM … AS name`, and `&&`-chained shell
commands. Anything else is refused loudly rather than misread.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

KEYWORDS = frozenset(
    {
        "ADD",
        "ARG",
        "CMD",
        "COPY",
        "ENTRYPOINT",
        "ENV",
        "EXPOSE",
        "FROM",
        "HEALTHCHECK",
        "LABEL",
        "RUN",
        "SHELL",
        "STOPSIGNAL",
        "USER",
        "VOLUME",
        "WORKDIR",
    }
)
PIP_OPTIONS_WITH_VALUES = frozenset(
    {"-c", "--constraint", "-r", "--requirement", "--python", "--target", "-t", "--wheel-dir", "-w"}
)


@dataclass(frozen=True)
class Instruction:
    keyword: str
    value: str
    line: int


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


@dataclass(frozen=True)
class PipInstall:
    """One `pip install` in a RUN: what it installs, under which constraints, where."""

    requirements: tuple[str, ...]
    requirement_files: tuple[str, ...]
    constraints: tuple[str, ...]
    python: str | None
    stage: str | None
    line: int


@dataclass
class Dockerfile:
    path: Path
    args: dict[str, str]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def pip_installs(self) -> list[PipInstall]:
        found = []
        for stage in self.stages:
            for run in stage.all("RUN"):
                for command in re.split(r"&&|;|\|\|", run.value):
                    words = shlex.split(command)
                    if "pip" not in " ".join(words[:4]) or "install" not in words:
                        continue
                    found.append(_pip_install(words, stage.name, run.line))
        return found


def _pip_install(words: list[str], stage: str | None, line: int) -> PipInstall:
    rest = words[words.index("install") + 1 :]
    requirements, files, constraints = [], [], []
    python = None
    options_before = words[: words.index("install")]
    if "--python" in options_before:
        python = options_before[options_before.index("--python") + 1]
    i = 0
    while i < len(rest):
        word = rest[i]
        if word in PIP_OPTIONS_WITH_VALUES:
            value = rest[i + 1]
            if word in {"-c", "--constraint"}:
                constraints.append(value)
            elif word in {"-r", "--requirement"}:
                files.append(value)
            i += 2
            continue
        if not word.startswith("-"):
            requirements.append(word)
        i += 1
    return PipInstall(tuple(requirements), tuple(files), tuple(constraints), python, stage, line)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    lines: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1])
            continue
        pending.append(stripped)
        lines.append((start, " ".join(part.strip() for part in pending if part.strip())))
        pending = []
    assert not pending, "the file ends inside a continued line"
    return lines


def _substitute(value: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), value)


def parse(path: Path) -> Dockerfile:
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line, text in _logical_lines(path.read_text()):
        keyword, _, value = text.partition(" ")
        keyword = keyword.upper()
        assert keyword in KEYWORDS, f"{path}:{line}: unknown instruction {keyword}"
        if keyword == "FROM":
            match = re.fullmatch(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", value, re.I)
            assert match, f"{path}:{line}: cannot read FROM {value}"
            stages.append(Stage(_substitute(match.group(1), global_args), match.group(2)))
        elif not stages:
            assert keyword == "ARG", f"{path}:{line}: only ARG may precede FROM"
            name, _, default = value.partition("=")
            global_args[name] = default
        else:
            stages[-1].instructions.append(Instruction(keyword, value, line))
    return Dockerfile(path, global_args, stages)
