"""Reading what a user hands hetbench (configs, record files, checkpoints): every way a file can be
wrong is one sentence (UserError), never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from hetbench.errors import UserError

MAX_BYTES = 16 * 1024 * 1024  # far above any record or checkpoint file a run writes; a larger one is a mistake
MAX_CONFIG_BYTES = 256 * 1024  # ours are under 2 KB; YAML parses a few MB for minutes, so refuse before parsing


def read_text(path: str | Path, what: str, max_bytes: int = MAX_BYTES) -> str:
    """The file's UTF-8 text; `what` names it in the sentence ("config file", "record file"); a file
    over `max_bytes` is refused before it is read."""
    file = Path(path)
    try:
        if file.is_dir():
            raise UserError(f"{what} {path} is a directory, not a file")
        if not file.exists():
            raise UserError(f"{what} {path} does not exist")
        if file.stat().st_size > max_bytes:
            raise UserError(f"{what} {path} is {file.stat().st_size:,} bytes: more than {max_bytes:,}, not one of ours")
        return file.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{what} {path} is not UTF-8 text") from None
    except OSError as e:
        raise UserError(f"{what} {path} cannot be read: {e.strerror or e}") from None


MAX_DEPTH = 32  # a config nests three deep, a record five; deeper is a mistake (or recursion's limit)


class _NoAliases(yaml.SafeLoader):
    """YAML without anchors and aliases, repeated keys or deep nesting: a config never needs aliases,
    and nested ones expand exponentially when the config is copied, merged or recorded (a "billion
    laughs"); of a key given twice, safe_load silently keeps the last."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, str) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, "anchors and aliases (*name) are not allowed in a hetbench config", event.start_mark
            )
        self.depth = getattr(self, "depth", 0) + 1
        try:
            if self.depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nested more than {MAX_DEPTH} levels deep", self.peek_event().start_mark
                )
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def load_yaml(text: str):
    """yaml.safe_load, refusing aliases, a key given twice and deep nesting (raises yaml.YAMLError)."""
    return yaml.load(text, Loader=_NoAliases)  # noqa: S506 - a SafeLoader subclass


def load_json(text: str, what: str):
    """json.loads, refusing a key given twice in one object and nesting deeper than MAX_DEPTH
    (raises ValueError, whose message is one sentence naming `what`)."""

    def unique(pairs):
        keys = [key for key, _ in pairs]
        if len(set(keys)) < len(keys):
            twice = next(key for key in keys if keys.count(key) > 1)
            raise ValueError(f"{what}: key {twice!r} is given twice in one object")
        return dict(pairs)

    try:
        data = json.loads(text, object_pairs_hook=unique)
    except RecursionError:
        raise ValueError(f"{what} is nested too deeply to be one of ours") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{what} is not valid JSON: {e}") from None
    if _depth(data) > MAX_DEPTH:
        raise ValueError(f"{what} is nested more than {MAX_DEPTH} levels deep: not one of ours")
    return data


def _depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0
