"""Reading a config file's YAML document within limits, so that no file makes the reader fail
with anything but a ConfigError naming it: at most MAX_CONFIG_BYTES are read, nesting deeper than
MAX_DEPTH and integers too long to convert are refused with their line, Python-object tags with
what a config may hold. Light (PyYAML only, no NumPy): the launcher reads the device with it
before the heavy imports.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError
from ..limits import MAX_INTEGER
from .shipped import valid_configs

MAX_CONFIG_BYTES = 1 << 20
MAX_DEPTH = 32  # nesting of mappings and lists
MAX_MERGED_KEYS = 10_000  # keys merges (``<<: *defaults``) may bring into one mapping


def read_yaml(path: str | Path, data: bytes | None = None) -> Any:
    """The document in the YAML file ``path``, read as ``yaml.safe_load`` reads it but within the
    limits above (size, nesting, integer length); every problem is a ConfigError naming the file.
    ``data``: the file's bytes where they were read already (a pipe can be read once only)."""
    text = _read_text(Path(path)) if data is None else _decode(Path(path), data)
    try:
        return yaml.load(text, Loader=_ConfigLoader)
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: {_yaml_problem(error)}") from error


def _read_text(path: Path) -> str:
    """The file's text; refused when it is not UTF-8 or longer than MAX_CONFIG_BYTES (read no further)."""
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError as error:
        raise ConfigError(f"config file {path} does not exist; {valid_configs()}") from error
    except OSError as error:
        raise ConfigError(f"cannot read config file {path}: {error.strerror or error}") from error
    return _decode(path, data)


def _decode(path: Path, data: bytes) -> str:
    """``data`` as text; refused when it is not UTF-8 or longer than MAX_CONFIG_BYTES."""
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: longer than {MAX_CONFIG_BYTES} bytes; a config is a short YAML file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from error


_YAML_TAG = re.compile(r"constructor for the tag '([^']*)'")


def _yaml_problem(error: yaml.YAMLError) -> str:
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    tag = _YAML_TAG.search(problem)
    if tag is not None:
        return f"{where}{_tag_problem(tag.group(1))}"
    return "not valid YAML: " + " ".join(f"{where}{problem}".split())


def _tag_problem(tag: str) -> str:
    short = tag.replace("tag:yaml.org,2002:", "!!")
    if short.startswith("!!python/"):
        return (f"refused the tag {short}: a config may not create Python objects "
                f"(configs are read with yaml.safe_load: plain mappings, lists, strings and numbers only)")
    return f"unknown YAML tag {short}; a config holds plain mappings, lists, strings and numbers only"


class _ConfigLoader(yaml.SafeLoader):
    """``yaml.safe_load``'s loader that refuses, with the line, what would otherwise escape as a
    RecursionError or ValueError: nesting deeper than MAX_DEPTH, integers too long to convert."""

    def __init__(self, stream):
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent, index):
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels; a config "
                                                  f"is a few levels of mappings and lists", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_yaml_int(self, node):
        try:
            return super().construct_yaml_int(node)
        except ValueError:
            raise yaml.constructor.ConstructorError(
                None, None, f"an integer of {len(node.value)} characters is too long to read; every integer "
                f"setting is at most {MAX_INTEGER}", node.start_mark) from None

    def flatten_mapping(self, node):
        """PyYAML's merge (``<<``), refused with its line where it would bring more than MAX_MERGED_KEYS
        keys into one mapping: PyYAML copies every merged key, so a mapping that merges an alias twice,
        merged twice by the next one, doubles at each line and 40 lines would take all memory."""
        merged = 0
        for key_node, value_node in node.value:
            if key_node.tag != "tag:yaml.org,2002:merge":
                continue
            subnodes = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            for subnode in (subnode for subnode in subnodes if isinstance(subnode, yaml.MappingNode)):
                self.flatten_mapping(subnode)
                merged += len(subnode.value)
                if merged > MAX_MERGED_KEYS:  # checked at once: a long list of aliases costs no more than the limit
                    raise yaml.constructor.ConstructorError(
                        None, None, f"the merges (<<) here bring more than {MAX_MERGED_KEYS} keys into one mapping",
                        node.start_mark)
        super().flatten_mapping(node)

    def construct_mapping(self, node, deep=False):
        _refuse_duplicate_keys(node)
        return super().construct_mapping(node, deep)


def _refuse_duplicate_keys(node: yaml.MappingNode) -> None:
    """A key given twice in one mapping (YAML forbids it; PyYAML would keep the last silently).
    Keys that a merge (``<<: *defaults``) brings in may be overridden."""
    first: dict[tuple[str, str], yaml.Node] = {}
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
            continue
        earlier = first.setdefault((key_node.tag, key_node.value), key_node)
        if earlier is not key_node:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key_node.value!r} (also on line {earlier.start_mark.line + 1}); each key "
                f"may appear once", key_node.start_mark)


_ConfigLoader.add_constructor("tag:yaml.org,2002:int", _ConfigLoader.construct_yaml_int)
