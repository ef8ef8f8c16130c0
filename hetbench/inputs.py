"""Reading what a user hands hetbench (configs, record files, checkpoints): every way a file can be
wrong is one sentence (UserError), never a traceback."""

from __future__ import annotations

from pathlib import Path

import yaml

from hetbench.errors import UserError

MAX_BYTES = 16 * 1024 * 1024  # far above any config or record file a run writes; a larger one is a mistake


def read_text(path: str | Path, what: str) -> str:
    """The file's UTF-8 text; `what` names it in the sentence ("config file", "record file")."""
    file = Path(path)
    try:
        if file.is_dir():
            raise UserError(f"{what} {path} is a directory, not a file")
        if not file.exists():
            raise UserError(f"{what} {path} does not exist")
        if file.stat().st_size > MAX_BYTES:
            raise UserError(f"{what} {path} is {file.stat().st_size:,} bytes: more than {MAX_BYTES:,}, not one of ours")
        return file.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{what} {path} is not UTF-8 text") from None
    except OSError as e:
        raise UserError(f"{what} {path} cannot be read: {e.strerror or e}") from None


class _NoAliases(yaml.SafeLoader):
    """YAML without anchors and aliases: a config never needs them, and nested aliases expand
    exponentially when the config is copied, merged or recorded (a "billion laughs")."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, "anchors and aliases (*name) are not allowed in a hetbench config", event.start_mark
            )
        return super().compose_node(parent, index)


def load_yaml(text: str):
    """yaml.safe_load, refusing aliases (raises yaml.YAMLError)."""
    return yaml.load(text, Loader=_NoAliases)  # noqa: S506 - a SafeLoader subclass
