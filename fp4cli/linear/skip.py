"""Which layers a recipe keeps in high precision: its `skip` patterns on module names.

A pattern is an fnmatch pattern on a module's full dotted name or its last part (`lm_head`,
`blocks.0.*`), or `last:N`: every layer inside the model's last N blocks. The blocks are the
numbered children (`<container>.<i>`) of the container with the most of them among the layers'
names (`blocks` in the vit and gpt tasks, `h` in GPT-2, `layers` in LLaMA), so a recipe keeps
"the last 15% of the layers" without naming them.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence

LAST_BLOCKS = re.compile(r"last:([1-9][0-9]*)")


def matches_skip(module_name: str, patterns: Iterable[str]) -> bool:
    """Whether a skip pattern (fnmatch) matches the module's full dotted name or its last part.
    `last:N` patterns must have been expanded (`expand_skip`); here they match nothing."""
    last = module_name.rsplit(".", 1)[-1]
    return any(fnmatch.fnmatchcase(n, p) for p in patterns for n in (module_name, last))


def is_skip_pattern(pattern: object) -> bool:
    """A non-empty string; `last:` patterns need a positive block count."""
    if not isinstance(pattern, str) or not pattern:
        return False
    return not pattern.startswith("last:") or LAST_BLOCKS.fullmatch(pattern) is not None


def expand_skip(patterns: Iterable[str], names: Sequence[str]) -> tuple[str, ...]:
    """`patterns` with each `last:N` replaced by one pattern per block among the N last blocks
    of the layers named `names` (`blocks.10.*`, ...); nothing where no blocks are found."""
    expanded: list[str] = []
    blocks = numbered_blocks(names)
    for pattern in patterns:
        match = LAST_BLOCKS.fullmatch(pattern)
        if match is None:
            expanded.append(pattern)
            continue
        kept = blocks[-int(match.group(1)) :] if blocks else []
        expanded += [f"{block}.*" for block in kept]
    return tuple(expanded)


def numbered_blocks(names: Sequence[str]) -> list[str]:
    """The blocks (`container.i`, in index order) of the container with the most numbered
    children among dotted module names; [] when none has any."""
    children: dict[str, set[int]] = {}
    for name in names:
        parts = name.split(".")
        for depth, part in enumerate(parts[:-1]):
            if part.isdigit():
                children.setdefault(".".join(parts[:depth]), set()).add(int(part))
    if not children:
        return []
    container = max(children, key=lambda c: (len(children[c]), -c.count(".")))
    prefix = f"{container}." if container else ""
    return [f"{prefix}{i}" for i in sorted(children[container])]
