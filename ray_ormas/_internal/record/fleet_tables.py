"""The fleet record's two growing tables as Parquet: `checks` (rank rows) and `summaries` (one row
per check), each a folder of immutable part files that stays a few dozen files long.

Layout, in one fit's fleet folder (record/fleet_record.py):

    checks/L<level>-<first>-<last>.parquet      rank rows: where (attempt, check, step, run_step,
                                                time), then the row (`RankRow`, common/fleet_records.py)
    summaries/L<level>-<first>-<last>.parquet   one row per check (record/check_summaries.py)

`PartsWriter` (on the head node) keeps the rows given since the last part in memory and writes
them as one level-0 part (`first` = `last` = its sequence number) when `flush` is called: every
PART_EVERY_S, soon after an alarm, and when the fit ends (record/fleet_record.py decides). When
MERGE_PARTS parts of one level are there, it writes them as one part of the next level (up to
TOP_LEVEL), covering their sequence numbers, one row group at a time, and only then deletes them:
a week of parts every 30 s is about 60 files, each row written four times in all. A reader
(`read_table`) takes the files whose range no other file's covers, so a merge cut short by a
crash neither loses nor doubles a row. Object stores need no appends: every file is written
whole, once.

Values are as the analysis made them (float64: `ray-ormas mlflow-sync` compares them with what
the live writer sent); nodes, digests and `slow_in` are dictionary-encoded strings. Read with
pyarrow, DuckDB or pandas, e.g. `pyarrow.dataset.dataset("<fleet folder>/checks",
format="parquet").to_table()` (a merge under way may show a row twice there;
`open_records().fleet_checks()` never does).

Hooks relied on: `pyarrow.parquet.write_table` / `read_table`, `pyarrow.fs` through RecordStore.
"""

from __future__ import annotations

import io
import posixpath
import re
import threading
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ray_ormas._internal.record.check_summaries import QUANTILES, SUMMARISED
from ray_ormas._internal.record.store import RecordStore

MERGE_PARTS = 8  # parts of one level merged into one of the next
TOP_LEVEL = 3  # parts of this level (8^3 flushes: about 4 hours at one every 30 s) are not merged
PART = re.compile(r"^L(\d+)-(\d{10})-(\d{10})\.parquet$")
CHECKS_TABLE = "checks"
SUMMARIES_TABLE = "summaries"

_WHERE = [
    ("attempt", pa.int32()),
    ("check", pa.int64()),
    ("step", pa.int64()),
    ("run_step", pa.int64()),
    ("time", pa.float64()),
]
ROWS_SCHEMA = pa.schema(
    [
        *_WHERE,
        ("rank", pa.int32()),
        ("node", pa.dictionary(pa.int32(), pa.string())),
        ("data_s", pa.float64()),
        ("forward_s", pa.float64()),
        ("wall_s", pa.float64()),
        ("timed_steps", pa.int32()),
        ("loss", pa.float64()),
        ("nonfinite", pa.bool_()),
        ("digest", pa.dictionary(pa.int32(), pa.string())),
        ("relative_score", pa.float64()),
        ("individual_score", pa.float64()),
        ("slow", pa.bool_()),
        ("slow_in", pa.dictionary(pa.int32(), pa.string())),
    ]
)
SUMMARIES_SCHEMA = pa.schema(
    [
        *_WHERE,
        ("ranks", pa.int32()),
        ("full_rows", pa.bool_()),
        ("loss_mean", pa.float64()),
        ("loss_rank0", pa.float64()),
        *[(f"{value}_{q}", pa.float64()) for value in SUMMARISED for q, _ in QUANTILES],
        ("slow_count", pa.int32()),
        ("slow_ranks", pa.list_(pa.int32())),
        ("worst_rank", pa.int32()),
        ("worst_node", pa.string()),
        ("nonfinite_count", pa.int32()),
        ("nonfinite_ranks", pa.list_(pa.int32())),
        ("digest_groups", pa.int32()),
        ("odd_count", pa.int32()),
        ("odd_ranks", pa.list_(pa.int32())),
    ]
)
SCHEMAS = {CHECKS_TABLE: ROWS_SCHEMA, SUMMARIES_TABLE: SUMMARIES_SCHEMA}


@dataclass(frozen=True)
class _Part:
    level: int
    first: int
    last: int
    path: str

    @property
    def name(self) -> str:
        return posixpath.basename(self.path)


def part_name(level: int, first: int, last: int) -> str:
    return f"L{level}-{first:010d}-{last:010d}.parquet"


def _parts(store: RecordStore, folder: str) -> list[_Part]:
    """The part files in `folder`, the ones another file covers (a merge cut short) left out, in
    order."""
    infos = store.filesystem.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
    found = []
    for info in infos:
        m = PART.match(info.base_name) if info.type == pafs.FileType.File else None
        if m:
            found.append(_Part(int(m.group(1)), int(m.group(2)), int(m.group(3)), info.path))
    covered = [
        p
        for p in found
        if any(q is not p and q.first <= p.first and p.last <= q.last and q.level > p.level for q in found)
    ]
    return sorted((p for p in found if p not in covered), key=lambda p: (p.first, p.level))


def _write(store: RecordStore, path: str, table: pa.Table) -> int:
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="zstd")
    data = buffer.getvalue()
    store.write_bytes(path, data)
    return len(data)


def _read(store: RecordStore, path: str) -> pa.Table:
    with store.filesystem.open_input_file(path) as f:
        return pq.read_table(f)


def plain_schema(table: str) -> pa.Schema:
    """The schema `read_table` returns for `table`: its dictionary columns as plain strings."""
    schema = SCHEMAS[table]
    return pa.schema(
        [pa.field(f.name, f.type.value_type if pa.types.is_dictionary(f.type) else f.type) for f in schema]
    )


def read_table(store: RecordStore, fleet_folder: str, table: str) -> pa.Table:
    """One fit's `checks` or `summaries` table (every part, oldest first; dictionary columns
    decoded); an empty table when there is none."""
    parts = _parts(store, posixpath.join(fleet_folder, table))
    tables = [_read(store, p.path) for p in parts]
    plain = plain_schema(table)
    if not tables:
        return plain.empty_table()
    return pa.concat_tables([t.cast(plain) for t in tables])


class PartsWriter:
    """One fit's growing table, written as parts (see the module docstring). `add` is cheap and
    thread-safe; `flush` writes (call it from one thread at a time). Raises what storage raises."""

    def __init__(self, store: RecordStore, fleet_folder: str, table: str) -> None:
        self._store = store
        self._folder = posixpath.join(fleet_folder, table)
        self._schema = SCHEMAS[table]
        self._rows: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._made = False
        self._next = 0
        self._levels: dict[int, list[_Part]] = {}
        self.bytes_written = 0

    def add(self, rows: list[dict[str, Any]]) -> None:
        if rows:
            with self._lock:
                self._rows.extend(rows)

    @property
    def pending(self) -> int:
        return len(self._rows)

    def flush(self) -> None:
        """Write the rows given since the last part as a new part, then merge full levels. Rows
        a failed write did not take are kept for the next flush."""
        with self._lock:
            rows, self._rows = self._rows, []
        if not rows:
            return
        try:
            table = pa.Table.from_pylist([{k: row.get(k) for k in self._schema.names} for row in rows], self._schema)
            self._make_folder()
            part = _Part(0, self._next, self._next, posixpath.join(self._folder, part_name(0, self._next, self._next)))
            self.bytes_written += _write(self._store, part.path, table)
        except Exception:
            with self._lock:
                self._rows[:0] = rows
            raise
        self._next += 1
        self._levels.setdefault(0, []).append(part)
        self._merge(0)
        pa.default_memory_pool().release_unused()  # Arrow's allocator gives the pages back: the head stays flat

    def _merge(self, level: int) -> None:
        parts = self._levels.get(level, [])
        if len(parts) < MERGE_PARTS or level >= TOP_LEVEL:
            return
        first, last = parts[0].first, parts[-1].last
        path = posixpath.join(self._folder, part_name(level + 1, first, last))
        fs = self._store.filesystem
        with fs.open_output_stream(path) as out:  # one row group at a time: memory stays flat
            writer = pq.ParquetWriter(out, self._schema, compression="zstd")
            for p in parts:
                with fs.open_input_file(p.path) as f:
                    for batch in pq.ParquetFile(f).iter_batches():
                        writer.write_table(pa.Table.from_batches([batch]).cast(self._schema))
            writer.close()
        self.bytes_written += fs.get_file_info(path).size or 0
        for p in parts:  # only once the merged part is whole: a reader takes it over them
            fs.delete_file(p.path)
        self._levels[level] = []
        self._levels.setdefault(level + 1, []).append(_Part(level + 1, first, last, path))
        self._merge(level + 1)

    def _make_folder(self) -> None:
        if not self._made:
            self._store.filesystem.create_dir(self._folder, recursive=True)
            self._made = True
