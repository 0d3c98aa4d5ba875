"""YAML as ramstream reads a config: PyYAML's safe loader, bounded, and strict about keys.

- **Aliases are bounded before they are expanded.** ``yaml.safe_load`` builds an alias as a
  reference to the anchored value, cheaply; everything that walks the result (validation, a
  copy, a message quoting a value) walks it expanded, and a few hundred bytes of nested aliases
  (a "billion laughs") expand to billions of values. The composed document is measured first,
  expanded, in time linear in its nodes; more than ``MAX_VALUES`` values, more than
  ``MAX_DEPTH`` levels or a value that contains itself is refused, before anything is built.
  Merge keys (``<<: *anchor``) count as the values they copy.
- **A key given twice in one mapping is refused by name**, with both lines: YAML forbids it,
  and PyYAML (so mergekit) silently keeps the last value, losing the user's first setting.
- **Anything PyYAML refuses, or cannot build** (an integer of more digits than Python converts,
  nesting deeper than its recursive parser goes), is one ``ConfigError`` naming the file.

A file larger than ``MAX_BYTES`` is refused before it is parsed (``read_text``).
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ramstream.errors import ConfigError, excerpt

MAX_VALUES = 100_000  # values of a document, aliases expanded (a config holds hundreds)
MAX_DEPTH = 64  # levels of nesting (a config has fewer than ten)
MAX_BYTES = 4 * 1024**2
_MERGE = "tag:yaml.org,2002:merge"


class _Refused(Exception):
    """A document refused while it is composed or built; ``load_all`` names the file."""


class _Loader(yaml.SafeLoader):
    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, MappingNode):
            _refuse_duplicate_keys(self, node)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: ScalarNode) -> int:
        try:
            return super().construct_yaml_int(node)  # type: ignore[no-any-return]
        except ValueError as exc:  # more digits than int() converts
            raise ConstructorError(None, None, f"cannot read the integer ({exc})", node.start_mark) from None


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)


def _refuse_duplicate_keys(loader: _Loader, node: MappingNode) -> None:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == _MERGE or not isinstance(key_node, ScalarNode):
            continue
        key = loader.construct_object(key_node)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise _Refused(
                f"the key {excerpt(key)} is given twice in one mapping (lines {seen[key]} and {line}); keep one "
                "(YAML allows a key once; mergekit would silently keep the last)"
            )
        seen[key] = line


def load_all(text: str, source: object) -> list[Any]:
    """The documents of ``text`` (``source`` names it in messages), each checked before it is built."""
    loader = _Loader(text)
    try:
        documents = []
        while loader.check_node():
            node = loader.get_node()
            if node is not None:
                _check_size(node)
            documents.append(loader.construct_document(node))
        return documents
    except _Refused as exc:
        raise ConfigError(f"{source}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML ({_reason(exc)})") from None
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply to read (at most {MAX_DEPTH} levels)") from None
    finally:
        loader.dispose()


def load(text: str, source: object) -> Any:
    """The one document of ``text`` (None when empty), as ``yaml.safe_load`` reads it."""
    documents = load_all(text, source)
    if len(documents) > 1:
        raise ConfigError(f"{source}: holds {len(documents)} YAML documents (separated by ---); give one")
    return documents[0] if documents else None


def _reason(exc: yaml.YAMLError) -> str:
    """PyYAML's message on one line, cut short: it may quote the document."""
    text = " ".join(str(exc).split())
    return text if len(text) <= 200 else text[:197] + "..."


def _check_size(root: Node) -> None:
    """Refuse a document that expands to more than ``MAX_VALUES`` values or ``MAX_DEPTH``
    levels, or that contains itself; nodes an alias shares are measured once (memoised), so this
    takes time in proportion to the document's text, not to its expansion."""
    size: dict[int, tuple[int, int]] = {}  # id(node) -> (values, depth), aliases expanded
    open_nodes: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in size:
            continue
        children = _children(node)
        if not children_done:
            if id(node) in open_nodes:
                raise _Refused(f"line {node.start_mark.line + 1}: a value that contains itself through an alias")
            open_nodes.add(id(node))
            stack.append((node, True))
            for child in children:
                if id(child) in open_nodes:
                    raise _Refused(f"line {child.start_mark.line + 1}: a value that contains itself through an alias")
                stack.append((child, False))
            continue
        open_nodes.discard(id(node))
        values = 1 + sum(size[id(c)][0] for c in children)
        depth = 1 + max((size[id(c)][1] for c in children), default=0)
        if values > MAX_VALUES:
            raise _Refused(
                f"line {node.start_mark.line + 1}: its aliases (*name) expand to more than {MAX_VALUES} values; "
                "write the values out, or use fewer aliases"
            )
        if depth > MAX_DEPTH:
            raise _Refused(f"line {node.start_mark.line + 1}: nested more than {MAX_DEPTH} levels deep")
        size[id(node)] = (values, depth)


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []
