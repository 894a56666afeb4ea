#!/usr/bin/env python3
"""Leave out of a requirements file what the target machine already has, and what those packages need.

Usage, as `make wheelhouse WHEEL_HAVE=<list>` runs it::

    python -m tools.wheel_have --have LIST --report REPORT.json --python-version 3.12 -o OUT REQUIREMENTS

How it works and why: docs/tools.md (wheel_have.py).
"""

import json
import re
import sys

from tools import common

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name as normalize  # PEP 503: lower case, runs of -_. as one -
except ImportError:  # the Python that runs pip download may lack packaging; pip carries a copy
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name as normalize

#: kept even when the target has it (docs/tools.md, wheel_have.py)
ALWAYS_KEPT = ("setuptools",)
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")


class ListError(Exception):
    """The list of the target's packages cannot be read."""


def read_have(path):
    """{normalized name: version or None} of a pip freeze / pip list / conda list file."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise ListError(f"{path}: {getattr(error, 'strerror', None) or error}") from None
    have = {}
    for number, line in enumerate(lines, 1):
        words = line.split()
        if not words or words[0].startswith(("#", "-")) or [w.lower() for w in words[:2]] == ["package", "version"]:
            continue
        match = _NAME.match(words[0])
        if not match:
            raise ListError(f"{path}:{number}: not a package name and version: {line.strip()!r}")
        rest = words[0][match.end():]
        if rest.startswith("=="):
            version = rest[2:]
        elif not rest and len(words) > 1 and words[1] != "@":
            version = words[1]
        else:
            version = None
        have[normalize(match.group())] = version
    if not have:
        raise ListError(f"{path} lists no packages")
    return have


def target_environment(python_version):
    """Environment-marker values of CPython ``python_version`` on x86_64 Linux."""
    full = f"{python_version}.0"
    return {"python_version": python_version, "python_full_version": full, "implementation_version": full,
            "implementation_name": "cpython", "platform_python_implementation": "CPython",
            "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
            "platform_machine": "x86_64", "extra": ""}


def dependencies(report):
    """{normalized name: [normalized names it requires]} from a pip --report, markers unevaluated."""
    return {normalize(item["metadata"]["name"]): [Requirement(r) for r in item["metadata"].get("requires_dist") or []]
            for item in report.get("install", [])}


def on_target(have, requires, environment):
    """Every name the target has: the listed ones and, transitively, what the pinned ones among them require."""
    seen = set(have)
    queue = [name for name in have if name in requires]
    while queue:
        for requirement in requires[queue.pop()]:
            if requirement.marker is not None and not requirement.marker.evaluate(environment):
                continue
            name = normalize(requirement.name)
            if name not in seen:
                seen.add(name)
                if name in requires:
                    queue.append(name)
    return seen


def requirement_name(line):
    match = _NAME.match(line.strip())
    return normalize(match.group()) if match else None


def main(argv=None):
    parser = common.Parser(description=__doc__.split("\n")[0])
    parser.add_argument("requirements", help="requirements file to filter (pinned name==version lines)")
    parser.add_argument("--have", required=True, help="what the target has (pip freeze / pip list / conda list)")
    parser.add_argument("--report", required=True, help="pip install --dry-run --report JSON of the requirements")
    parser.add_argument("--python-version", required=True, help="the target's Python version, e.g. 3.12")
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("--prog", default="wheel_have.py", help="name in front of messages")
    args = parser.parse_args(argv)
    try:
        have = read_have(args.have)
    except ListError as error:
        print(f"{args.prog}: error: {error}", file=sys.stderr)
        return 2
    with open(args.report, encoding="utf-8") as handle:
        requires = dependencies(json.load(handle))
    present = on_target(have, requires, target_environment(args.python_version)) - set(ALWAYS_KEPT)
    with open(args.requirements, encoding="utf-8") as handle:
        lines = [line for line in handle.read().splitlines() if requirement_name(line)]
    kept = [line for line in lines if requirement_name(line) not in present]
    left = [line for line in lines if requirement_name(line) in present]
    with open(args.output, "w", encoding="utf-8") as handle:
        handle.writelines(line + "\n" for line in kept)
    listed = sorted(line.split("==")[0] for line in left if requirement_name(line) in have)
    needed = sorted(line.split("==")[0] for line in left if requirement_name(line) not in have)
    print(f"== {args.prog}: left out {len(left)} of {len(lines)} requirements: {len(listed)} that {args.have} lists "
          f"({', '.join(listed) or 'none'}) and {len(needed)} that those need ({', '.join(needed) or 'none'})",
          file=sys.stderr)
    differ = [f"{line.split('==')[0]} {have[requirement_name(line)]} (pin {line.split('==', 1)[1].strip()})"
              for line in left if "==" in line and have.get(requirement_name(line))
              and have[requirement_name(line)] != line.split("==", 1)[1].strip()]
    if differ:
        print(f"== {args.prog}: the target's own versions will be used: {', '.join(differ)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
