"""The relation vector: samples to the target accuracy per batch size — `powerctl.relation/1`.

Besides the vector the client uses (`samples_to_target`, `relation`), a file may keep the evidence
behind it (extra keys; files without them still load): `samples_per_seed` (per batch size, the seeds'
samples to target, in seed order), `samples_mean` and `samples_sd`, `relation_raw` (the means' vector)
and `relation_fitted` (the batch-efficiency model's, `fit_batch_efficiency`), `vector` (which of the
two `samples_to_target` is) and `seeds_needed` (`fl_server.relation`'s stopping rule). Selection under
uncertainty (`powerctl.selection.joint`, rule "robust") reads the per-seed samples from here, so whatever
carries a RelationVector carries what the rule needs.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from powerctl.errors import ArgumentError, FileFormatError
from powerctl.files.jsonfile import (
    Fields,
    FrozenJson,
    check_number,
    plain_json,
    read_json,
    write_json,
)
from powerctl.files.mapping import MAX_BATCH_SIZE, Integer, Invalid, Number, check_arguments, shown

RELATION_SCHEMA = "powerctl.relation/1"
VECTORS: tuple[str, ...] = ("raw", "fitted")
"""Which vector the client uses: the seeds' means, or the batch-efficiency model fitted to the seeds."""
RELATION_RULES: tuple[str, ...] = ("mean", "robust", "interval")
"""How selection (`powerctl.selection.joint`) reads the vector: its mean (Algorithm 1), every seed's (least
mean regret), or its mean with an interval on each pair's ratio to the best, the seeds paired (pairs the
seeds cannot tell from the best go to the larger batch size: the default). Named here, beside
the vector, so that a run's settings check them without the selection."""
DEFAULT_RELATION_RULE = "interval"
INTERVAL_STANDARD_ERRORS = 2.0
"""The half-width of an interval from the seeds (an entry's, `interval_halfwidths`; a ratio of two
entries', `paired_halfwidth`), in standard errors of the seeds' mean: two, as the project's other noise
bands (bench/paper_tables.py's calibration). With 3 seeds that is about an 82 % Student-t interval; the
95 % one (4.3 standard errors) makes the interval rule drift to the largest batch size on the text
tables (docs/results/paper_tables.md)."""


MAX_SAMPLES_TO_TARGET = 1e12
"""The most samples to the target an entry may hold: far above any proxy run (a billion samples is weeks
on a server), low enough that a typo is one line and not a relation of 0.0 or a rate that underflows."""
SAMPLES_KIND = Number(0.0, MAX_SAMPLES_TO_TARGET, above=True)
BATCH_SIZE_KIND = Integer(1, MAX_BATCH_SIZE)
FIELDS = ("model", "proxy_dataset", "target_accuracy", "batch_sizes", "samples_to_target")
DERIVED = ("schema", "relation")
"""Keys a relation file holds besides `FIELDS` that are not evidence: `extra` may name none of these."""


@dataclass(frozen=True)
class RelationVector:
    """`relation[i] = samples_to_target[i] / samples_to_target[last]`, largest batch size last. Frozen,
    `batch_sizes` and `samples_to_target` tuples (compare them with tuples; `to_dict` writes lists): a
    plan made from it cannot change behind its back. `extra` (the evidence) is read-only and never names
    a field."""

    model: str
    proxy_dataset: str
    target_accuracy: float
    batch_sizes: Sequence[int]
    """Held as a tuple (a list given is made one)."""
    samples_to_target: Sequence[float]
    """Held as a tuple (a list given is made one)."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """The evidence, held read-only (a `FrozenJson`: its lists as tuples, all the way down; a mapping
    given is copied); `to_dict` writes it back as dicts and lists."""

    @property
    def relation(self) -> list[float]:
        ref = self.samples_to_target[-1]
        return [s / ref for s in self.samples_to_target]

    def coarse_warning(self) -> str | None:
        """A warning when every batch size needs the same samples (relation all 1.000): the evaluation
        interval was most likely too coarse to tell them apart, and the vector then cannot guide a choice."""
        if len(self.batch_sizes) < 2 or len(set(self.samples_to_target)) > 1:
            return None
        every = self.extra.get("eval_every_samples")
        interval = f" (evaluated every {every} samples)" if every else ""
        return (
            f"every batch size of the relation vector ({self.model}, {self.proxy_dataset}) reached the "
            f"target after the same {self.samples_to_target[0]:g} samples{interval}: relation 1.000 "
            "everywhere tells the batch sizes apart only by speed; estimate it again evaluating more "
            "often (fl-server relation --eval-every)"
        )

    def per_seed_samples(self) -> list[list[float]] | None:
        """Per batch size, the seeds' samples to target (None when the file does not keep them)."""
        per_seed = self.extra.get("samples_per_seed")
        return None if per_seed is None else [[float(v) for v in row] for row in per_seed]

    def seed_scenarios(self) -> list[dict[int, float]]:
        """One samples map per seed (seed k's samples at every batch size), the spread the robust rule
        weighs; with no per-seed samples (or unequal counts), the one map of `samples_to_target`."""
        per_seed = self.per_seed_samples()
        if not per_seed or len({len(row) for row in per_seed}) != 1 or not per_seed[0]:
            return [self.samples_map()]
        return [
            {b: row[k] for b, row in zip(self.batch_sizes, per_seed, strict=True)}
            for k in range(len(per_seed[0]))
        ]

    def interval_halfwidths(self) -> dict[int, float]:
        """Batch size → the half-width of its entry's interval from the seeds, relative to the entry
        (`samples_to_target`): `INTERVAL_STANDARD_ERRORS` standard errors of the seeds' mean, sd / sqrt(n).
        0.0 where the file keeps no per-seed samples or a batch size has one seed (no spread to state)."""
        per_seed = self.per_seed_samples() or [[] for _ in self.batch_sizes]
        out: dict[int, float] = {}
        for b, entry, row in zip(self.batch_sizes, self.samples_to_target, per_seed, strict=True):
            n = len(row)
            out[b] = 0.0 if n < 2 else INTERVAL_STANDARD_ERRORS * statistics.stdev(row) / math.sqrt(n) / entry
        return out

    def paired_halfwidth(self, b: int, ref: int) -> float:
        """The half-width of the ratio samples(b) / samples(ref) from the seeds, relative to that ratio:
        `INTERVAL_STANDARD_ERRORS` standard errors of the mean of each seed's own ratio. Paired: a seed
        slow at every batch size (harder initial head, data order) moves both entries alike, which
        cancels in its ratio, while `interval_halfwidths` count it in each entry, far wider (measured:
        docs/results/paper_tables.md).
        0.0 for b == ref and where the file keeps fewer than two seeds' samples."""
        seeds = self.seed_scenarios()
        if b == ref or len(seeds) < 2:
            return 0.0
        ratios = [seed[b] / seed[ref] for seed in seeds]
        sem = statistics.stdev(ratios) / math.sqrt(len(ratios))
        return INTERVAL_STANDARD_ERRORS * sem / statistics.fmean(ratios)

    def interval(self) -> dict[int, tuple[float, float]]:
        """Batch size → the interval of r_b from the seeds (`interval_halfwidths`; the reference entry's
        own spread is common to every pair, so r_b's interval scales the entry's alone)."""
        half = self.interval_halfwidths()
        return {b: (r * (1 - half[b]), r * (1 + half[b])) for b, r in self.as_map().items()}

    def as_map(self) -> dict[int, float]:
        """Batch size → r_b."""
        return dict(zip(self.batch_sizes, self.relation, strict=True))

    def samples_map(self) -> dict[int, float]:
        return dict(zip(self.batch_sizes, self.samples_to_target, strict=True))

    def restricted(self, batch_sizes: Sequence[int]) -> RelationVector:
        """The vector over `batch_sizes` only (a node that cannot fill the larger ones), its per-seed
        samples kept for those (r_b is then relative to the largest batch size kept)."""
        keep = [i for i, b in enumerate(self.batch_sizes) if b in set(batch_sizes)]
        if len(keep) == len(self.batch_sizes):
            return self
        extra: dict[str, Any] = {}
        if (per_seed := self.per_seed_samples()) is not None:
            extra["samples_per_seed"] = [per_seed[i] for i in keep]
        samples = {self.batch_sizes[i]: self.samples_to_target[i] for i in keep}
        return RelationVector.from_samples(
            self.model, self.proxy_dataset, self.target_accuracy, samples, **extra
        )

    @classmethod
    def from_samples(
        cls, model: str, proxy_dataset: str, target_accuracy: float, samples: dict[int, float], **extra: Any
    ) -> RelationVector:
        bs = sorted(samples)
        return cls(model, proxy_dataset, target_accuracy, bs, [float(samples[b]) for b in bs], dict(extra))

    @classmethod
    def from_seeds(
        cls,
        model: str,
        proxy_dataset: str,
        target_accuracy: float,
        per_seed: dict[int, Sequence[float]],
        *,
        vector: str = "raw",
        **extra: Any,
    ) -> RelationVector:
        """The vector from per-seed samples to target: their means (`vector="raw"`) or the batch-
        efficiency model fitted to them (`"fitted"`); both, the spread and the fit are kept in the file."""
        where = "RelationVector.from_seeds"
        if vector not in VECTORS:
            raise ArgumentError(
                f"{where}: unknown relation vector {vector!r}; use one of {', '.join(VECTORS)}"
            )
        if not isinstance(per_seed, dict) or not per_seed:
            raise ArgumentError(
                f"{where}: 'per_seed' must map each batch size to its seeds' samples to target, "
                f"got {per_seed!r}"
            )
        bs = sorted(per_seed)
        rows = [list(per_seed[b]) if isinstance(per_seed[b], (list, tuple)) else [] for b in bs]
        if any(not row for row in rows):
            raise ArgumentError(f"{where}: every batch size needs a list of one or more seeds' samples")
        for row in rows:
            for v in row:  # NaN, inf, ≤ 0 or a string: the file's reader would refuse it too
                check_arguments(where, samples_to_target=(v, SAMPLES_KIND))
        rows = [[float(v) for v in row] for row in rows]
        means = [statistics.fmean(row) for row in rows]
        sds = [statistics.stdev(row) if len(row) > 1 else 0.0 for row in rows]
        fit = fit_batch_efficiency(bs, rows)
        chosen = fit.samples if vector == "fitted" else means
        return cls.from_samples(
            model,
            proxy_dataset,
            target_accuracy,
            dict(zip(bs, chosen, strict=True)),
            **extra,
            vector=vector,
            samples_per_seed=rows,
            samples_mean=means,
            samples_sd=sds,
            relation_raw=[m / means[-1] for m in means],
            relation_fitted=[f / fit.samples[-1] for f in fit.samples],
            batch_efficiency=fit.to_dict(),
        )

    def to_dict(self) -> dict[str, Any]:
        """The file's mapping: the fields, then the evidence (`extra`, which never replaces a field)."""
        d: dict[str, Any] = {
            "schema": RELATION_SCHEMA,
            "model": self.model,
            "proxy_dataset": self.proxy_dataset,
            "target_accuracy": self.target_accuracy,
            "batch_sizes": list(self.batch_sizes),
            "samples_to_target": list(self.samples_to_target),
            "relation": self.relation,
        }
        d.update({k: plain_json(v) for k, v in self.extra.items() if k not in d})
        return d

    def save(self, path: str | Path) -> None:
        write_json(path, self.to_dict())

    def __post_init__(self) -> None:
        """Checked as a file is (`from_dict`), so that selection and the strategy never see NaN,
        negative, unsorted or mismatched entries: one ArgumentError line (a ValueError)."""
        as_list = [list(v) if isinstance(v, tuple) else v for v in (self.batch_sizes, self.samples_to_target)]
        if not isinstance(self.extra, Mapping):
            raise ArgumentError(f"RelationVector: 'extra' must be a dict, got {shown(self.extra)}")
        if shadows := sorted(str(k) for k in self.extra if k in FIELDS or k in DERIVED):
            raise ArgumentError(
                f"RelationVector: 'extra' key {shadows[0]!r} is a field of the vector (or derived from "
                "them); give it as the field, or keep the evidence under another name"
            )
        plain, frozen = _kept_extra(self.extra)
        data = {
            **plain,
            "model": self.model,
            "proxy_dataset": self.proxy_dataset,
            "target_accuracy": self.target_accuracy,
            "batch_sizes": as_list[0],
            "samples_to_target": as_list[1],
        }
        try:
            checked = _checked(data, "RelationVector")
        except FileFormatError as exc:
            raise ArgumentError(str(exc)) from None
        checked["extra"] = frozen  # read-only: a plan made from the vector cannot change behind its back
        for name, value in checked.items():  # frozen: set once, as __post_init__ may
            object.__setattr__(self, name, value)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "relation") -> RelationVector:
        return cls(**_checked(data, where))

    @classmethod
    def load(cls, path: str | Path) -> RelationVector:
        return cls.from_dict(read_json(path, RELATION_SCHEMA), str(path))


def _kept_extra(extra: Mapping[str, Any]) -> tuple[dict[str, Any], FrozenJson]:
    """The evidence as its file holds it (`plain_json`) and as the vector keeps it (`frozen_json`), or
    one ArgumentError line: a vector that cannot be saved or sent would fail later, inside `save`, a
    message or `save_results`."""
    try:
        plain = plain_json(extra)
        json.dumps(plain, allow_nan=False)
        frozen = FrozenJson(plain)
    except (TypeError, ValueError) as exc:
        raise ArgumentError(
            f"RelationVector: 'extra' must hold JSON values (a file keeps them): {exc}"
        ) from None
    except RecursionError:
        raise ArgumentError("RelationVector: 'extra' is nested too deeply to be kept in a file") from None
    return dict(plain), frozen


def _checked(data: dict[str, Any], where: str) -> dict[str, Any]:
    """A relation vector's fields from its file's mapping, every value checked (FileFormatError lines
    naming `where` and the key); what `RelationVector` is made from."""
    f = Fields(data, where)
    target = f.number("target_accuracy", positive=True)
    if target > 1:
        raise f.fail(f"'target_accuracy' must be in (0, 1], got {target}")
    bs = f.list_of("batch_sizes")
    samples = f.list_of("samples_to_target")
    if not bs:
        raise f.fail("'batch_sizes' is empty")
    if len(bs) != len(samples):
        raise f.fail("'batch_sizes' and 'samples_to_target' differ in length")
    for b in bs:
        try:
            BATCH_SIZE_KIND(b)
        except Invalid:
            raise f.fail(f"batch sizes must be integers in [1, {MAX_BATCH_SIZE}], got {shown(b)}") from None
    bs = [int(b) for b in bs]  # plain ints (numpy's converted): the file and the messages hold them
    if sorted(set(bs)) != bs:
        raise f.fail("'batch_sizes' must be strictly increasing (largest last)")
    values = [f.check("samples_to_target", s, SAMPLES_KIND) for s in samples]
    if not all(1e-9 <= v / values[-1] <= 1e9 for v in values):  # r_b = samples / the last: what selects
        raise f.fail(
            f"'samples_to_target' {samples}: an entry over the last is outside [1e-9, 1e9] (no measured "
            "relation is that uneven; a time times it would not be finite or not > 0)"
        )
    if "samples_per_seed" in data:
        per_seed = f.list_of("samples_per_seed")
        if len(per_seed) != len(bs) or any(not isinstance(row, list) or not row for row in per_seed):
            raise f.fail("'samples_per_seed' must hold one non-empty list per batch size")
        for row in per_seed:
            for v in row:
                f.check("samples_per_seed", v, SAMPLES_KIND)
    if "relation" in data:
        rel = f.list_of("relation")
        want = [v / values[-1] for v in values]
        if len(rel) != len(values) or any(
            abs(check_number(r, "relation", f, positive=True) - w) > 1e-6 * max(1.0, w)
            for r, w in zip(rel, want, strict=True)
        ):
            wanted = ", ".join(f"{w:.4g}" for w in want)
            raise f.fail(
                f"'relation' {rel} is not samples_to_target divided by its last entry, [{wanted}]: "
                "correct it or leave it out (it is derived)"
            )
    known = {*FIELDS, *DERIVED}
    return {
        "model": f.string("model"),
        "proxy_dataset": f.string("proxy_dataset"),
        "target_accuracy": target,
        "batch_sizes": tuple(bs),
        "samples_to_target": tuple(values),
        "extra": {k: v for k, v in data.items() if k not in known},
    }


@dataclass(frozen=True)
class BatchEfficiencyFit:
    """samples(b) = e_min · (1 + b / b_crit) ("An Empirical Model of Large-Batch Training", McCandlish
    et al. 2018): below the critical batch size a larger batch costs few extra samples, above it
    samples grow in proportion to b. Fitted by weighted least squares in relative error to every seed's
    samples, slope ≥ 0 (samples never fall as b grows in this model)."""

    batch_sizes: list[int]
    samples: list[float]
    """The model's samples to target per batch size."""
    e_min: float
    b_crit: float | None
    """None: no growth measured (slope 0, b_crit infinite)."""
    chi2: float
    """Σ over batch sizes of ((mean − model) / standard error of the mean)²: how far the means sit
    from the model in units of their own noise (batch sizes without spread, e.g. one seed, left out)."""
    dof: int

    @property
    def explains(self) -> bool:
        """The model is within the seeds' noise: chi2 no more than dof + 2·sqrt(2·dof) (about the 95th
        percentile of a chi-squared with dof degrees of freedom for the dof seen here)."""
        return self.dof > 0 and self.chi2 <= self.dof + 2 * math.sqrt(2 * self.dof)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": "e_min*(1+b/b_crit)",
            "e_min": self.e_min,
            "b_crit": self.b_crit,
            "chi2": self.chi2,
            "dof": self.dof,
            "explains": self.explains,
        }


def fit_batch_efficiency(
    batch_sizes: Sequence[int], per_seed: Sequence[Sequence[float]]
) -> BatchEfficiencyFit:
    """Fit samples(b) = a + c·b (a = e_min, c = e_min / b_crit, c ≥ 0) to every seed's samples, each
    weighted by 1 / (its batch size's mean)² so that every batch size counts by its relative error."""
    bs = [int(b) for b in batch_sizes]
    means = [statistics.fmean(row) for row in per_seed]
    xs, ys, ws = [], [], []
    for b, row, m in zip(bs, per_seed, means, strict=True):
        for v in row:
            xs.append(float(b))
            ys.append(float(v))
            ws.append(1.0 / (m * m))
    sw = sum(ws)
    xbar = sum(w * x for w, x in zip(ws, xs, strict=True)) / sw
    ybar = sum(w * y for w, y in zip(ws, ys, strict=True)) / sw
    sxx = sum(w * (x - xbar) ** 2 for w, x in zip(ws, xs, strict=True))
    sxy = sum(w * (x - xbar) * (y - ybar) for w, x, y in zip(ws, xs, ys, strict=True))
    slope = max(0.0, sxy / sxx) if sxx > 0 else 0.0
    intercept = ybar - slope * xbar
    if intercept <= 0:  # samples proportional to b (or worse): through the origin
        slope = sum(w * x * y for w, x, y in zip(ws, xs, ys, strict=True)) / sum(
            w * x * x for w, x in zip(ws, xs, strict=True)
        )
        intercept = 0.0
    fitted = [intercept + slope * b for b in bs]
    chi2, dof = 0.0, 0
    for row, m, f in zip(per_seed, means, fitted, strict=True):
        se = statistics.stdev(row) / math.sqrt(len(row)) if len(row) > 1 else 0.0
        if se > 0:  # a batch size whose seeds all agree gives no noise scale: left out of chi2
            chi2 += ((m - f) / se) ** 2
            dof += 1
    dof = max(0, dof - 2)
    b_crit = None if slope == 0 else (intercept / slope if intercept > 0 else 0.0)
    return BatchEfficiencyFit(bs, fitted, intercept, b_crit, chi2, dof)
