"""Safe YAML for configs: JSON-like values only, bounded size (bottom layer: imports only ``errors``).

``yaml.safe_load`` already refuses ``!!python/object``, but still builds sets, bytes and
dates, and expands aliases by reference, so a "billion laughs" document of a few
hundred bytes becomes exponentially large the first time it is copied (as a
config is, by ``dataclasses.asdict``). :func:`load_yaml` composes the node graph,
checks it (:func:`_check_nodes`) and only then constructs Python values.
"""

from __future__ import annotations

from typing import Any

import yaml

from horizonrl.errors import ConfigError

#: Most YAML values after alias expansion, and the deepest nesting, a config may have.
MAX_YAML_NODES = 100_000
MAX_YAML_DEPTH = 64


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader limited to JSON-like values (timestamps stay strings; see :func:`load_yaml`)."""


_StrictLoader.yaml_implicit_resolvers = {
    ch: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for ch, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_ALLOWED_TAGS = {
    f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "seq", "map", "merge")
}


def _yaml_error(e: yaml.YAMLError) -> str:
    """One line: the problem and where (PyYAML's messages span several lines)."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    problem = getattr(e, "problem", None) or getattr(e, "context", None) or str(e).splitlines()[0]
    return f"{problem} (line {mark.line + 1}, column {mark.column + 1})" if mark else str(problem)


def _check_nodes(root: yaml.Node, source: str) -> None:
    """Refuse tags outside JSON's types, cycles, over-deep nesting and alias bombs.

    Aliases share nodes, so the document's size *after* expansion (what copying the config
    builds) is computed over the node graph with memoisation: linear in the file, however
    many times an alias is repeated.
    """
    size: dict[int, int] = {}
    started: set[int] = set()
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    while stack:
        node, depth, done = stack.pop()
        key = id(node)
        children = (
            [c for kv in node.value for c in kv]
            if isinstance(node, yaml.MappingNode)
            else list(node.value)
            if isinstance(node, yaml.SequenceNode)
            else []
        )
        if done:
            size[key] = 1 + sum(size[id(c)] for c in children)
            if size[key] > MAX_YAML_NODES:
                raise ConfigError(
                    f"{source}: YAML expands to over {MAX_YAML_NODES} values (aliases repeated recursively?) "
                    f"near line {node.start_mark.line + 1}"
                )
            continue
        if key in size:
            continue
        if key in started:
            raise ConfigError(f"{source}: YAML alias refers to itself (line {node.start_mark.line + 1})")
        if node.tag not in _ALLOWED_TAGS:
            tag = node.tag.replace("tag:yaml.org,2002:", "!!")
            raise ConfigError(
                f"{source}: YAML tag {tag} is not allowed (line {node.start_mark.line + 1}); a config holds "
                "only strings, numbers, booleans, null, lists and mappings"
            )
        if depth > MAX_YAML_DEPTH:
            raise ConfigError(
                f"{source}: YAML is nested deeper than {MAX_YAML_DEPTH} (line {node.start_mark.line + 1})"
            )
        started.add(key)
        stack.append((node, depth, True))
        stack.extend((c, depth + 1, False) for c in children)


def load_yaml(text: str, *, source: str = "the text") -> Any:
    """Parse one YAML document into JSON-like values; ConfigError naming ``source`` otherwise.

    No tags beyond the core types (``!!python/object``, ``!!binary``, ``!!set``, custom tags are
    refused), dates stay strings, at most :data:`MAX_YAML_DEPTH` levels and
    :data:`MAX_YAML_NODES` values after alias expansion (billion laughs is refused).
    """
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_nodes(node, source)
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        raise ConfigError(f"{source} is not valid YAML: {_yaml_error(e)}") from None
    except RecursionError:
        raise ConfigError(f"{source} is not valid YAML: nested too deeply") from None
    finally:
        loader.dispose()
