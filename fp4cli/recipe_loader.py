"""Loading recipes: shipped names and YAML files, `base:` inheritance, `--set` overrides.

Use it as `fp4cli.recipes` (the package that also holds the shipped YAML files):

    from fp4cli.recipes import load_recipe, apply_overrides
    recipe = apply_overrides(load_recipe("tetrajet"), ["linear.grad_weight.hadamard=32"])

A file may start with `base: NAME_OR_PATH` (a shipped name, or a path relative to the file).
Inheritance deep-merges mappings, the child's keys winning: an operand given as a mapping merges
into the base's operand, one given as a preset name or null replaces it; lists (skip) are
replaced. Each base is validated on its own first, so an error names the file of the chain in
which it first appears.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from fp4cli.recipe_schema import (
    DICT_KEYS,
    FILE_KEYS,
    Recipe,
    RecipeError,
    build_recipe,
    did_you_mean,
    excerpt,
)


def list_recipes() -> list[str]:
    """The shipped recipe names, sorted."""
    return sorted(path.stem for path in _shipped_dir().glob("*.yaml"))


def load_recipe(name_or_path: str | os.PathLike[str]) -> Recipe:
    """A shipped recipe by name ("tetrajet"), or a recipe file by path (a name that ends in
    .yaml / .yml or holds a path separator)."""
    ref = os.fspath(name_or_path)
    return _load(_locate(ref, ref, "", Path.cwd()), chain=())[1]


def apply_overrides(recipe: Recipe, overrides: Sequence[str]) -> Recipe:
    """A new Recipe with `key=value` overrides (dotted keys, values parsed as YAML) applied to
    the resolved dict, then validated again. `linear.forward.x=nvfp4` replaces an operand,
    `linear.forward.x.rounding=sr` changes one of its fields."""
    if not overrides:
        return recipe
    label = f"{_display(recipe.source)} (--set)"
    values: list[tuple[str, Any]] = []
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise RecipeError(label, item, "expected key=value, e.g. linear.forward.x.rounding=sr")
        try:
            values.append((key, parse_value(text)))
        except yaml.YAMLError as error:
            raise RecipeError(label, key, f"value is not valid YAML: {error}") from None
    return apply_values(recipe, values, label)


def apply_values(
    recipe: Recipe, values: Sequence[tuple[str, Any]], label: str | None = None
) -> Recipe:
    """A new Recipe with (dotted key, value) pairs set in order on the resolved dict, then
    validated again. A key with `*` components (fnmatch-style) names every path of the resolved
    recipe that already holds its last component: `linear.*.*.rounding` sets the field on every
    quantized operand (null operands stay high precision), `linear.grad_*.hadamard` both
    backward GEMMs' transforms, `linear.*.*.sr_bits` every operand that rounds
    stochastically."""
    label = label or f"{_display(recipe.source)} (--set)"
    tree = recipe.to_dict()
    for key, value in values:
        paths = expand_key(tree, key)
        if not paths:
            raise RecipeError(label, key, "matches no quantized operand or mapping")
        for path in paths:
            _set(tree, path, value, label)
    return build_recipe(tree, label, keys=DICT_KEYS, name=recipe.name, source=recipe.source)


def expand_key(tree: dict[str, Any], key: str) -> list[str]:
    """The dotted keys that `key` (with `*` components, fnmatch-style) names in `tree`: those
    whose parent mapping already holds the last component. A key without wildcards names
    itself."""
    if "*" not in key and "?" not in key:
        return [key]
    *parents, last = key.split(".")
    nodes: list[tuple[str, Any]] = [("", tree)]
    for part in parents:
        nodes = [
            (f"{prefix}{name}.", child)
            for prefix, node in nodes
            if isinstance(node, dict)
            for name, child in node.items()
            if fnmatch.fnmatchcase(name, part) and isinstance(child, dict)
        ]
    holds = _WILDCARD_HOLDERS.get(last, lambda node: last in node)
    return [f"{prefix}{last}" for prefix, node in nodes if isinstance(node, dict) and holds(node)]


# Fields a resolved operand leaves out at their default, which a wildcard key still sets: where
# they apply (`sr_bits` on every operand that rounds stochastically).
_WILDCARD_HOLDERS: dict[str, Any] = {
    "sr_bits": lambda node: node.get("rounding") == "sr",
    "four_over_six_metric": lambda node: node.get("four_over_six") is True,
    "scale_bf16": lambda node: (
        node.get("element") == "e2m1"
        and node.get("scale") == "e8m0"
        and node.get("block") in ("row", "column", "tensor")
        and node.get("scale_rule") == "ceil"
    ),
}


def _set(tree: dict[str, Any], key: str, value: Any, label: str) -> None:
    *parents, last = key.split(".")
    node = tree
    for depth, part in enumerate(parents, 1):
        here = ".".join(parents[:depth])
        if part in node and node[part] is None:
            raise RecipeError(label, here, f"is null; set it whole, e.g. {here}={{...}}")
        node = node.setdefault(part, {})  # a new key is an unknown one: validation names it
        if not isinstance(node, dict):
            raise RecipeError(label, here, f"is {node!r}, not a mapping")
    if last == "preset":  # a preset replaces the operand's expanded fields, not under them
        node.clear()
    node[last] = value


MAX_FILE_BYTES = 1 << 20
MAX_ALIASES = 100
MAX_DEPTH = 50
MAX_VALUES = 100_000


def _shipped_dir() -> Path:
    return Path(str(resources.files("fp4cli.recipes")))


def _display(path: str | Path) -> str:
    """A path relative to the working directory when inside it, else as given."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def names_a_file(ref: str) -> bool:
    """Whether a recipe reference is a file path (ends in .yaml / .yml or holds a path
    separator) rather than a shipped recipe's name."""
    return ref.endswith((".yaml", ".yml")) or "/" in ref or os.sep in ref


def _locate(ref: str, label: str, key: str, relative_to: Path) -> Path:
    if names_a_file(ref):
        try:
            path = (relative_to / Path(ref).expanduser()).resolve(strict=False)
        except (OSError, RuntimeError) as error:  # a symlink loop, on any Python version
            raise RecipeError(label, key, f"cannot resolve {ref!r}: {error}") from None
        if path.exists() and not path.is_file():
            raise RecipeError(label, key, f"{ref!r} is not a regular file")
        if not path.is_file():
            where = f" (looked for {path})" if key else ""
            raise RecipeError(label, key, f"no such recipe file {ref!r}{where}")
        return path
    shipped = list_recipes()
    if ref not in shipped:
        hint = did_you_mean(ref, shipped)
        raise RecipeError(
            label,
            key,
            f"unknown recipe {ref!r}{hint}; shipped: {', '.join(shipped)}; "
            "or give a path to a .yaml file",
        )
    return _shipped_dir() / f"{ref}.yaml"


def _load(path: Path, chain: tuple[Path, ...]) -> tuple[dict[str, Any], Recipe]:
    """(the merged recipe mapping, without base; the validated Recipe)."""
    label = _display(path)
    raw = _read_yaml(path, label)
    if not isinstance(raw, dict):
        expected = f"must be a mapping of {', '.join(FILE_KEYS)}"
        raise RecipeError(label, "", f"{expected} (got {excerpt(raw)})")
    base = raw.pop("base", None)
    if base is not None:
        if not isinstance(base, str) or not base:
            raise RecipeError(label, "base", f"must be a recipe name or path (got {excerpt(base)})")
        base_path = _locate(base, label, "base", path.parent)
        if base_path in (*chain, path):
            cycle = " -> ".join(_display(p) for p in (*chain, path, base_path))
            raise RecipeError(label, "base", f"inheritance cycle: {cycle}")
        raw = _merge(_load(base_path, (*chain, path))[0], raw)
    return raw, build_recipe(raw, label, keys=FILE_KEYS, name=path.stem, source=str(path))


def read_yaml_file(path: Path) -> Any:
    """A recipe or sweep file's YAML, read as the recipe files are (strict, bounded). Raises
    ValueError with a one-line reason: unreadable, too large, not UTF-8, invalid YAML."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ValueError(f"is {size:,} bytes; a recipe or sweep file is at most 1 MiB")
        data = path.read_bytes()
    except OSError as error:
        raise ValueError(f"cannot read: {error.strerror or error}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"is not UTF-8 text (byte {error.start} is {data[error.start]:#x})"
        ) from None
    try:
        return parse_value(text)
    except yaml.MarkedYAMLError as error:
        line = f"line {error.problem_mark.line + 1}: " if error.problem_mark else ""
        raise ValueError(f"{line}invalid YAML: {error.problem}") from None
    except yaml.YAMLError as error:
        raise ValueError(f"invalid YAML: {error}") from None


def _read_yaml(path: Path, label: str) -> Any:
    try:
        raw = read_yaml_file(path)
    except ValueError as error:
        raise RecipeError(label, "", str(error)) from None
    if raw is None:
        raise RecipeError(label, "", "empty recipe file (expected a mapping: description, linear)")
    return raw


def _merge(base: Any, child: Any) -> Any:
    if isinstance(child, dict):
        if isinstance(base, str):  # an operand given by preset name, refined by the child
            base = {"preset": base}
        elif isinstance(base, int) and not isinstance(base, bool):  # a Hadamard given by size
            base = {"size": base}
        if isinstance(base, dict):
            return base | {k: _merge(base.get(k), v) for k, v in child.items()}
    return child


class _StrictLoader(yaml.SafeLoader):
    """A SafeLoader that rejects duplicate keys (a second `forward:` would silently win), more
    than MAX_ALIASES aliases, a document that stands for more than MAX_VALUES values once its
    aliases expand (a few hundred bytes of aliases can stand for gigabytes) and nesting deeper
    than MAX_DEPTH."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases = getattr(self, "_aliases", 0) + 1
            if self._aliases > MAX_ALIASES:
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(
                    None, None, f"more than {MAX_ALIASES} aliases", mark
                )
        depth = getattr(self, "_depth", 0) + 1
        if depth > MAX_DEPTH:
            mark = self.peek_event().start_mark
            raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH}", mark)
        self._depth = depth
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth = depth - 1

    def get_single_node(self) -> Any:
        node = super().get_single_node()
        if node is not None:
            _check_expansion(node, {}, set())
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _check_expansion(node: Any, sizes: dict[int, int], open_nodes: set[int]) -> int:
    """How many values `node` stands for with its aliases expanded (memoized per node); a
    ComposerError beyond MAX_VALUES, or for a node that contains itself."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_nodes:
        raise yaml.composer.ComposerError(None, None, "an alias refers to itself", node.start_mark)
    open_nodes.add(key)
    size = 1
    if isinstance(node, yaml.SequenceNode):
        size += sum(_check_expansion(child, sizes, open_nodes) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            size += _check_expansion(key_node, sizes, open_nodes)
            size += _check_expansion(value_node, sizes, open_nodes)
    if size > MAX_VALUES:
        raise yaml.composer.ComposerError(
            None, None, f"stands for more than {MAX_VALUES:,} values (aliases expand)",
            node.start_mark,
        )  # fmt: skip
    open_nodes.discard(key)
    sizes[key] = size
    return size


# YAML 1.1 reads 3e-4 (no dot) as a string; recipes and --set values mean a number.
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def parse_value(text: str) -> Any:
    """A `--set` value or recipe scalar, parsed as the recipe files are (3e-4 is a float)."""
    return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader
