"""Reading what a user hands hetbench (configs, record files, checkpoints): every way a file can be
wrong is one sentence (UserError), never a traceback."""

from __future__ import annotations

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
