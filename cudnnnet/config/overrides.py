"""``--set KEY.PATH=VALUE``: config values replaced on the command line, and ``config.yaml``, the resolved config.

    cudnnnet-train --config mnist_mlp --set train.optimizer.lr=0.01 --set model.fc1.out_size=800

A key path names mappings by key and the layers of ``model`` by name (``fc1``, or the name a layer
without one is given: ``dense1``, ``activation2``) or by index (``model.0`` or ``model[0]``). The
value is read as YAML (``true``, ``[3, 3]``, ``{name: adam, lr: 0.001}``; empty or ``null`` removes the
key, so its default applies); a number written ``1e-3``, which YAML 1.1 reads as text, is a number.
Names and paths (``TEXT_KEYS``) are taken as written. The overridden mapping is then validated as a
file is, and an error at an overridden key names the ``--set`` it came from.
"""

from __future__ import annotations

import copy
import math
import re
from typing import Any, Sequence

import yaml

from ..errors import ConfigError, UsageError
from ..util.suggest import did_you_mean

TEXT_KEYS = ("name", "dir", "train_images", "train_labels", "test_images", "test_labels", "train_file", "test_file")
PIECE = re.compile(r"([^\[\]]+)?((?:\[\d+\])*)")  # a key, then any [index]
EXAMPLE = "train.optimizer.lr=0.01"


def parse_assignment(text: str) -> tuple[list[str], Any]:
    """(key path segments, value) of ``KEY.PATH=VALUE``; UsageError for text of another form."""
    key, equals, value_text = text.partition("=")
    segments = _segments(key)
    if not equals or not segments:
        raise UsageError(f"--set {text!r}: expected KEY.PATH=VALUE, e.g. --set {EXAMPLE}")
    return segments, _value(segments[-1], value_text, text)


def _segments(key: str) -> list[str]:
    """``model[2].out_size`` or ``model.2.out_size`` -> ["model", "2", "out_size"]; [] where malformed."""
    segments = []
    for piece in key.strip().split("."):
        match = PIECE.fullmatch(piece)
        if not piece or match is None:
            return []
        segments += ([match.group(1)] if match.group(1) else []) + re.findall(r"\[(\d+)\]", match.group(2))
    return segments


def _value(last_key: str, text: str, assignment: str) -> Any:
    """The value ``text`` as the schema reads it at ``last_key``."""
    if last_key in TEXT_KEYS and text:
        return text
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as error:
        problem = " ".join(str(getattr(error, "problem", None) or error).split())
        raise UsageError(f"--set {assignment}: the value is not valid YAML ({problem})") from None
    return _number_or_text(value) if isinstance(value, str) else value


def _number_or_text(text: str):
    """``1e-3`` as the number it says (YAML 1.1 reads it as text); other text as it is."""
    try:
        number = float(text)
    except ValueError:
        return text
    if not math.isfinite(number):
        return text
    return int(text) if re.fullmatch(r"[+-]?\d+", text.strip()) else number


def apply_overrides(mapping: Any, assignments: Sequence[str]) -> tuple[Any, dict[str, str]]:
    """(a copy of ``mapping`` with each assignment made in order, {key path as messages write it: the
    assignment}). ConfigError where a path leads through something that is not a mapping or names no layer."""
    if not isinstance(mapping, dict):
        return mapping, {}
    mapping = copy.deepcopy(mapping)
    paths = {}
    for text in assignments:
        segments, value = parse_assignment(text)
        paths[_assign(mapping, segments, value, text)] = text
    return mapping, paths


def _assign(mapping: dict, segments: list[str], value: Any, text: str) -> str:
    """Set ``value`` at ``segments`` in ``mapping`` (None removes the key); returns the key path as
    ``config`` messages write it (``model[2].out_size``)."""
    node, shown = mapping, ""
    for depth, segment in enumerate(segments):
        last = depth == len(segments) - 1
        if isinstance(node, list):
            index = _layer_index(node, segment, shown, text)
            shown += f"[{index}]"
            if last:
                node[index] = value
                return shown
            node = _child(node, index, shown, text)
            continue
        shown = f"{shown}.{segment}" if shown else segment
        if last:
            if value is None:
                node.pop(segment, None)
            else:
                node[segment] = value
            return shown
        if node.get(segment) is None:
            node[segment] = {}
        node = _child(node, segment, shown, text)
    return shown


def _child(node, key, shown: str, text: str):
    """``node[key]`` where a key path may go on through it (a mapping or a list), else ConfigError."""
    child = node[key]
    if not isinstance(child, (dict, list)):
        raise ConfigError(f"--set {text}: {shown} is {child!r}, not a mapping; set {shown} itself")
    return child


def _layer_index(layers: list, segment: str, shown: str, text: str) -> int:
    """The index of the layer ``segment`` names (an index, or a layer's name), else ConfigError."""
    if segment.isdigit():
        if int(segment) < len(layers):
            return int(segment)
        raise ConfigError(f"--set {text}: {shown} has {len(layers)} layers (indices 0 to {len(layers) - 1}), "
                          f"not {segment}")
    names = layer_names(layers)
    if segment in names:
        return names.index(segment)
    raise ConfigError(f"--set {text}: {shown} has no layer named {segment!r}; its layers: {', '.join(names)}"
                      f"{did_you_mean(segment, names)}")


def layer_names(layers: list) -> list[str]:
    """Each layer's name: its own, or what ``config`` names a layer without one (its type and count)."""
    counts: dict[str, int] = {}
    names = []
    for layer in layers:
        kind = layer.get("type") if isinstance(layer, dict) else None
        if isinstance(kind, str):
            counts[kind] = counts.get(kind, 0) + 1
        given = layer.get("name") if isinstance(layer, dict) else None
        names.append(given if isinstance(given, str) else f"{kind}{counts.get(kind, 0)}")
    return names


def parse_overridden(mapping: Any, assignments: Sequence[str], source: str, parse_config):
    """``parse_config(mapping, source=source)`` (config.py's) with ``assignments`` made; an error at an
    overridden key (or inside it) names the ``--set`` instead of the file."""
    overridden, paths = apply_overrides(mapping, assignments)
    try:
        return parse_config(overridden, source=source)
    except ConfigError as error:
        text = str(error)
        rest = text[len(source) + 2:] if text.startswith(f"{source}: ") else None
        for path, assignment in reversed(paths.items()):
            if rest is not None and re.match(re.escape(path) + r"[.:\[]", rest):
                raise ConfigError(f"--set {assignment}: {rest}") from None
        raise


def config_yaml(config) -> str:
    """The YAML of ``config`` (a Config) as ``load_config`` reads it back: the resolved config of a run."""
    header = "# the resolved config of this run: cudnnnet-train --config config.yaml trains it again\n"
    return header + yaml.safe_dump(config.to_dict(), sort_keys=False, allow_unicode=True)
