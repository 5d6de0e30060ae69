"""Runs that could not be written because the file stayed locked: spilled to `<db>.pending/` as JSON, one
file per run, and moved into the database by the next write (or `flush_pending`)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from urllib.parse import quote

from runner.records import Generation, Round, RunRecord
from runner.store.schema import StoreError


def record_to_dict(record: RunRecord) -> dict:
    return dataclasses.asdict(record)


def _tuples(data: dict) -> dict:
    return {key: tuple(value) if isinstance(value, list) else value for key, value in data.items()}


def record_from_dict(data: dict) -> RunRecord:
    """Inverse of record_to_dict, after a JSON round trip turned tuples into lists."""
    gen = data["generation"]
    if gen is not None:
        gen = Generation(**{**_tuples(gen), "rounds": tuple(Round(**_tuples(r)) for r in gen["rounds"])})
    return RunRecord(**{**data, "generation": gen})



def pending_dir(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + ".pending")


def spill(db_path: Path, record: RunRecord) -> None:
    final = pending_dir(db_path) / f"{quote(record.run_id, safe='')}.json"
    temp = final.with_name(final.name + ".tmp")
    try:
        final.parent.mkdir(exist_ok=True)
        temp.write_text(json.dumps(record_to_dict(record)))
        os.replace(temp, final)  # atomic: a reader never sees half a record
    except OSError as error:
        raise StoreError(f"{db_path} is locked and run {record.run_id} could not be spilled: {error}") from None


def pending(db_path: Path) -> list[tuple[Path, RunRecord]]:
    folder = pending_dir(db_path)
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    loaded = [(f, _load_pending(f)) for f in files]
    return [(f, record) for f, record in loaded if record is not None]


def _load_pending(file: Path) -> RunRecord | None:
    try:
        return record_from_dict(json.loads(file.read_text()))
    except FileNotFoundError:  # flushed by a writer since the listing
        return None
    except (ValueError, TypeError, KeyError) as error:
        raise StoreError(f"{file} is not a readable pending run ({error}); move it away") from None


