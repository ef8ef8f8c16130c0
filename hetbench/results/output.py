"""What one run writes under results_dir, in one place: its record file as rows finish, its
checkpoints while rows run, and at the end its tables and plots. The runner hands results_dir
here once; nothing else in a run opens it."""

from __future__ import annotations

from pathlib import Path

from hetbench.config import RunConfig
from hetbench.results.checkpoints import RunCheckpoints
from hetbench.results.record import Record
from hetbench.results.records import RecordFile, atomic_write
from hetbench.results.report import write_tables


class RunOutput:
    def __init__(self, run: RunConfig, resumed: RecordFile | None = None) -> None:
        self.root, self.name = Path(run.results_dir), run.name
        self.file = resumed or RecordFile(self.root, run.name)  # reserved now: a second run never writes over it
        self.checkpoints = RunCheckpoints(self.root, self.file.path.stem) if run.checkpoint_every else None

    @property
    def records(self) -> list[Record]:
        return self.file.records

    def add(self, record: Record, key: str | None = None, replacing: Record | None = None) -> None:
        """A row's record, in place of `replacing` (its record after an earlier pass) where given;
        `key`: its checkpoint, no longer needed once it is recorded whole."""
        self.file.add(record, replacing)
        if self.checkpoints and key:
            self.checkpoints.remove(key)

    def write_plan(self, text: str) -> None:
        """The plan the run made at its start, as `hetbench plan` writes it: NAME-plan.md."""
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write(self.root / f"{self.name}-plan.md", text)

    def save_run(self, config: dict, standalone: dict | None) -> None:
        """The config (and the speeds `auto` split by) a resumed run goes on with; only with checkpoints."""
        if self.checkpoints:
            self.checkpoints.save_run(config, standalone)

    def close(self) -> None:
        """Tables and plots of what was recorded; a run refused before any record leaves no file."""
        if self.records:
            write_tables(self.records, self.root, self.name)
        else:
            self.file.discard()


def reopened(run_id: str, results_dir: str) -> tuple[dict, dict | None, RecordFile]:
    """`hetbench run --resume RUN` (a record file, results/raw/RUN.json, or its name): the config it
    ran with as saved, the standalone speeds it split by, and its record file to go on with."""
    path = Path(run_id)
    if path.suffix == ".json":
        results_dir, run_id = str(path.parent.parent), path.stem
    saved, standalone = RunCheckpoints(results_dir, run_id).load_run()
    return (
        {**saved, "results_dir": results_dir},
        standalone,
        RecordFile.reopen(Path(results_dir) / "raw" / f"{run_id}.json"),
    )
