"""A complete check's facts as columns: what the head analyses at 1,000 ranks in a millisecond or two.

Pure numpy, no Ray, no torch. The fleet analysis (fleet/analysis.py) builds one `CheckColumns` per
complete check from what came: the nodes' relays' packed rows (fleet/wire.py, read with one
`numpy.frombuffer` for the lot) or ranks' whole `RankFacts` (a small fit; a rank whose node's relay
has not started). Every column is indexed alike, sorted by rank; a missing timing or score is NaN.
The analysis adds the straggler scores (`score`), and the head writes the check's summary
(`summary`, the fleet record's `summaries` row) from the columns. Per-rank objects are made only
where they are needed: `rows()` (the `RankRow`s a policy sees and the record keeps) on demand, once.

Hooks relied on: none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ray_ormas._internal.common.fleet_records import RankRow
from ray_ormas._internal.fleet.facts import RankFacts
from ray_ormas._internal.fleet.wire import DIGEST, LOSS, NONFINITE_LOSS, ROW_DTYPE, Intro
from ray_ormas._internal.record.check_summaries import QUANTILES, SHOWN_RANKS, SUMMARISED, WHERE

_FLOAT = np.float64


@dataclass(eq=False)
class CheckColumns:
    """One complete check, a column per fact (see the module docstring)."""

    rank: np.ndarray  # int64, ascending
    step: np.ndarray  # int64: each rank's step of its attempt's segment
    data_s: np.ndarray  # float64; NaN: not timed
    forward_s: np.ndarray
    wall_s: np.ndarray
    timed_steps: np.ndarray  # int64
    loss: np.ndarray  # float64 (NaN also when there is none: see has_loss)
    has_loss: np.ndarray  # bool
    nonfinite_loss: np.ndarray  # bool
    digest_code: np.ndarray  # int64: index into `digests`; -1: no digest
    digests: list[str]
    nodes: list[str | None]
    layers: dict[int, tuple[str, ...]] = field(default_factory=dict)  # rank -> layers with a non-finite gradient
    groups: dict[int, tuple[str, ...]] = field(default_factory=dict)  # rank -> parameter-group digests
    # The straggler scores (`score`); NaN / False where a rank is not scored.
    relative: np.ndarray | None = None
    individual: np.ndarray | None = None
    slow: np.ndarray | None = None
    slow_in_data: np.ndarray | None = None  # where slow: its data loading exceeds (else compute)
    _rows: list[RankRow] | None = None
    _split: tuple[int, list[int], tuple[int, int]] | None | bool = False  # False: not computed yet

    def __len__(self) -> int:
        return len(self.rank)

    # ------------------------------------------------------------------ building
    @classmethod
    def of_facts(cls, facts: Sequence[RankFacts]) -> CheckColumns:
        """The columns of whole `RankFacts`, one per rank, in rank order."""
        codes: dict[str | None, int] = {}
        digest_code = [-1 if f.digest is None else codes.setdefault(f.digest, len(codes)) for f in facts]
        return cls(
            rank=np.fromiter((f.rank for f in facts), np.int64, len(facts)),
            step=np.fromiter((f.step for f in facts), np.int64, len(facts)),
            data_s=_floats([f.data_s for f in facts]),
            forward_s=_floats([f.forward_s for f in facts]),
            wall_s=_floats([f.wall_s for f in facts]),
            timed_steps=np.fromiter((f.timed_steps for f in facts), np.int64, len(facts)),
            loss=_floats([f.loss for f in facts]),
            has_loss=np.fromiter((f.loss is not None for f in facts), bool, len(facts)),
            nonfinite_loss=np.fromiter((bool(f.nonfinite_loss) for f in facts), bool, len(facts)),
            digest_code=np.array(digest_code, dtype=np.int64),
            digests=[d for d in codes if d is not None],
            nodes=[f.node for f in facts],
            layers={f.rank: tuple(f.nonfinite_layers) for f in facts if f.nonfinite_layers},
            groups={f.rank: f.groups for f in facts if f.groups},
        )

    @classmethod
    def of_rows(
        cls, packed: bytes, extras: Mapping[int, Mapping[str, Any]], intros: Mapping[int, Intro]
    ) -> CheckColumns:
        """The columns of packed rows (fleet/wire.py; `extras` by rank, `intros`: each rank's
        intro of its attempt). A rank's row that came twice counts once: the last."""
        rows = np.frombuffer(packed, dtype=ROW_DTYPE)
        order = np.argsort(rows["rank"], kind="stable")
        rows = rows[order]
        ranks = rows["rank"].astype(np.int64)
        if len(ranks) > 1 and not (ranks[1:] != ranks[:-1]).all():  # duplicates: keep each rank's last
            keep = np.append(ranks[1:] != ranks[:-1], True)
            rows, ranks = rows[keep], ranks[keep]
        flags = rows["flags"]
        has_loss = (flags & LOSS) != 0
        has_digest = (flags & DIGEST) != 0
        rank_list = ranks.tolist()
        odd_digests = {r: str(x["digest"]) for r, x in extras.items() if "digest" in x}
        if has_digest.all() and not odd_digests:
            values, code = np.unique(rows["digest"], return_inverse=True)
            digests = [int(v).to_bytes(8, "little").hex() for v in values.tolist()]
            digest_code = code.astype(np.int64).reshape(-1)
        else:  # a rank without a digest, or with one that is not 16 hex digits: by rank, in Python
            raw = rows["digest"].tolist()
            per_rank = [
                odd_digests.get(r) if r in odd_digests else (int(d).to_bytes(8, "little").hex() if h else None)
                for r, d, h in zip(rank_list, raw, has_digest.tolist())
            ]
            codes: dict[str, int] = {}
            digest_code = np.array([-1 if d is None else codes.setdefault(d, len(codes)) for d in per_rank], np.int64)
            digests = list(codes)
        return cls(
            rank=ranks,
            step=rows["step"].astype(np.int64),
            data_s=rows["data_s"].astype(_FLOAT),
            forward_s=rows["forward_s"].astype(_FLOAT),
            wall_s=rows["wall_s"].astype(_FLOAT),
            timed_steps=rows["timed_steps"].astype(np.int64),
            loss=np.where(has_loss, rows["loss"], np.nan),
            has_loss=has_loss,
            nonfinite_loss=(flags & NONFINITE_LOSS) != 0,
            digest_code=digest_code,
            digests=digests,
            nodes=[(i.node if (i := intros.get(r)) is not None else None) for r in rank_list],
            layers={r: tuple(x["layers"]) for r, x in extras.items() if x.get("layers")},
        )

    # ------------------------------------------------------------------ reading
    def index(self, rank: int) -> int:
        return int(np.searchsorted(self.rank, rank))

    def digest(self, i: int) -> str | None:
        code = int(self.digest_code[i])
        return self.digests[code] if code >= 0 else None

    def nonfinite(self) -> np.ndarray:
        """Per rank: its loss or a gradient was not finite."""
        out = self.nonfinite_loss.copy()
        if self.layers:
            out[np.searchsorted(self.rank, sorted(self.layers))] = True
        return out

    def split(self) -> tuple[int, list[int], tuple[int, int]] | None:
        """(the majority's digest code, the other ranks, (a rank of the majority, the first other))
        when the digests differ (no digest counts as one); None when they agree. On a tie, rank 0's
        digest is the majority's, else the digest seen first in rank order."""
        if self._split is False:
            self._split = self._find_split()
        return self._split  # type: ignore[return-value]

    def _find_split(self) -> tuple[int, list[int], tuple[int, int]] | None:
        codes = self.digest_code
        if len(codes) == 0 or (codes == codes[0]).all():
            return None
        values, first, counts = np.unique(codes, return_index=True, return_counts=True)
        rank0_code = int(codes[0]) if int(self.rank[0]) == 0 else None
        in_order = sorted(zip(first.tolist(), values.tolist(), counts.tolist()))
        majority = max(in_order, key=lambda t: (t[2], t[1] == rank0_code))  # first of the best on ties
        odd = self.rank[codes != majority[1]].tolist()
        return majority[1], odd, (int(self.rank[majority[0]]), odd[0])

    def clean(self, compare_digests: bool) -> bool:
        """Every loss finite and, where replicas are compared, one digest."""
        if self.nonfinite_loss.any() or self.layers:
            return False
        return not compare_digests or self.split() is None

    def rows(self) -> list[RankRow]:
        """One `RankRow` per rank (made once, on demand)."""
        if self._rows is None:
            self._rows = list(self._make_rows())
        return self._rows

    def _make_rows(self) -> Any:
        nonfinite = self.nonfinite().tolist()
        scored = self.relative is not None
        relative = self.relative.tolist() if self.relative is not None else None
        individual = self.individual.tolist() if self.individual is not None else None
        slow = self.slow.tolist() if self.slow is not None else None
        in_data = self.slow_in_data.tolist() if self.slow_in_data is not None else None
        digests, codes = self.digests, self.digest_code.tolist()
        columns = zip(
            self.rank.tolist(),
            self.nodes,
            self.data_s.tolist(),
            self.forward_s.tolist(),
            self.wall_s.tolist(),
            self.timed_steps.tolist(),
            self.loss.tolist(),
            self.has_loss.tolist(),
        )
        for i, (rank, node, data, forward, wall, timed, loss, has_loss) in enumerate(columns):
            rel = relative[i] if relative is not None else _NAN
            is_slow = bool(slow[i]) if scored and slow is not None else False
            yield RankRow(
                rank=rank,
                node=node,
                data_s=None if data != data else data,
                forward_s=None if forward != forward else forward,
                wall_s=None if wall != wall else wall,
                timed_steps=timed,
                loss=loss if has_loss else None,
                nonfinite=nonfinite[i],
                digest=digests[codes[i]] if codes[i] >= 0 else None,
                relative_score=None if rel != rel else round(rel, 4),
                individual_score=None
                if individual is None or individual[i] != individual[i]
                else round(individual[i], 4),
                slow=is_slow,
                slow_in=(("data" if in_data[i] else "compute") if is_slow and in_data is not None else None),
            )

    def loss_mean(self) -> float | None:
        """The mean of the ranks' finite losses."""
        finite = self.loss[self.has_loss & np.isfinite(self.loss)]
        return math.fsum(finite.tolist()) / len(finite) if len(finite) else None

    def summary(self, where: Mapping[str, Any]) -> dict[str, Any]:
        """The check's row of the fleet record's `summaries` table, as
        record/check_summaries.py's `check_summary` makes it from the check's lines."""
        out: dict[str, Any] = {k: where.get(k) for k in WHERE}
        out["ranks"] = len(self)
        out["loss_mean"] = self.loss_mean()
        has_rank0 = len(self) > 0 and int(self.rank[0]) == 0
        out["loss_rank0"] = float(self.loss[0]) if has_rank0 and bool(self.has_loss[0]) else None
        relative = np.round(self.relative, 4) if self.relative is not None else None
        individual = np.round(self.individual, 4) if self.individual is not None else None
        values = {
            "relative_score": relative,
            "individual_score": individual,
            "data_s": self.data_s,
            "forward_s": self.forward_s,
            "wall_s": self.wall_s,
            "loss": np.where(self.has_loss, self.loss, np.nan),
        }
        for name in SUMMARISED:
            column = values[name]
            got = np.sort(column[np.isfinite(column)]) if column is not None else np.empty(0)
            for q, at in QUANTILES:
                out[f"{name}_{q}"] = float(got[round(at * (len(got) - 1))]) if len(got) else None
        slow = self.rank[self.slow].tolist() if self.slow is not None else []
        out["slow_count"] = len(slow)
        out["slow_ranks"] = slow[:SHOWN_RANKS]
        if relative is not None and np.isfinite(relative).any():
            worst = int(np.nanargmin(relative))  # the lowest score, the lowest rank on ties
            out["worst_rank"], out["worst_node"] = int(self.rank[worst]), self.nodes[worst]
        else:
            out["worst_rank"], out["worst_node"] = None, None
        nonfinite = self.rank[self.nonfinite()].tolist()
        out["nonfinite_count"] = len(nonfinite)
        out["nonfinite_ranks"] = nonfinite[:SHOWN_RANKS]
        split = self.split()
        odd = split[1] if split is not None else []
        out["digest_groups"] = len(self.digests)
        out["odd_count"] = len(odd)
        out["odd_ranks"] = odd[:SHOWN_RANKS]
        return out


_NAN = float("nan")


def _floats(values: list[float | None]) -> np.ndarray:
    return np.array([_NAN if v is None else v for v in values], dtype=_FLOAT)
