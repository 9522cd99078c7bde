"""The relation vector: samples to the target accuracy per batch size — `powerctl.relation/2`. A file may
also keep the evidence behind it (docs/reference/files.md), which the robust and interval rules read."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from powerctl.errors import ArgumentError, FileFormatError
from powerctl.files.jsonfile import Fields, FrozenJson, plain_json, read_json, write_json
from powerctl.files.mapping import MAX_BATCH_SIZE, Choice, Integer, Number, Text, check_arguments, shown

RELATION_SCHEMA = "powerctl.relation/2"
VECTORS: tuple[str, ...] = ("raw", "fitted")  # the seeds' means, or the batch-efficiency fit
RELATION_RULES: tuple[str, ...] = ("mean", "robust", "interval")
"""How selection reads the vector: its mean, every seed's, or its mean with a paired interval."""
DEFAULT_RELATION_RULE = "interval"
INTERVAL_STANDARD_ERRORS = 2.0  # an interval's half-width (docs/results/paper_tables.md)


SAMPLES_KIND = Number(0.0, 1e12, above=True)  # 1e12: far above any proxy run, so a typo is refused
BATCH_SIZE_KIND = Integer(1, MAX_BATCH_SIZE)
FIELDS = ("model", "proxy_dataset", "target_accuracy", "batch_sizes", "samples_to_target")
DERIVED = ("schema", "relation")  # keys besides FIELDS that are not evidence: never in `extra`


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
    samples_to_target: Sequence[float]
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def relation(self) -> list[float]:
        ref = self.samples_to_target[-1]
        return [s / ref for s in self.samples_to_target]

    def coarse_warning(self) -> str | None:
        """A warning when every batch size needs the same samples: most likely evaluated too coarsely."""
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
        """One samples map per seed; without per-seed samples (or with unequal counts), `samples_map()`."""
        per_seed = self.per_seed_samples()
        if not per_seed or len({len(row) for row in per_seed}) != 1 or not per_seed[0]:
            return [self.samples_map()]
        return [
            {b: row[k] for b, row in zip(self.batch_sizes, per_seed, strict=True)}
            for k in range(len(per_seed[0]))
        ]

    def interval_halfwidths(self) -> dict[int, float]:
        """Batch size → its entry's relative interval half-width (0.0 for fewer than two seeds)."""
        per_seed = self.per_seed_samples() or [[] for _ in self.batch_sizes]
        out: dict[int, float] = {}
        for b, entry, row in zip(self.batch_sizes, self.samples_to_target, per_seed, strict=True):
            n = len(row)
            out[b] = 0.0 if n < 2 else INTERVAL_STANDARD_ERRORS * statistics.stdev(row) / math.sqrt(n) / entry
        return out

    def paired_halfwidth(self, b: int, ref: int) -> float:
        """The relative half-width of samples(b) / samples(ref) from each seed's own ratio (paired)."""
        seeds = self.seed_scenarios()
        if b == ref or len(seeds) < 2:
            return 0.0
        ratios = [seed[b] / seed[ref] for seed in seeds]
        sem = statistics.stdev(ratios) / math.sqrt(len(ratios))
        return INTERVAL_STANDARD_ERRORS * sem / statistics.fmean(ratios)

    def interval(self) -> dict[int, tuple[float, float]]:
        """Batch size → the interval of r_b from the seeds (`interval_halfwidths`)."""
        half = self.interval_halfwidths()
        return {b: (r * (1 - half[b]), r * (1 + half[b])) for b, r in self.as_map().items()}

    def as_map(self) -> dict[int, float]:
        """Batch size → r_b."""
        return dict(zip(self.batch_sizes, self.relation, strict=True))

    def samples_map(self) -> dict[int, float]:
        return dict(zip(self.batch_sizes, self.samples_to_target, strict=True))

    def restricted(self, batch_sizes: Sequence[int]) -> RelationVector:
        """The vector over `batch_sizes` only, with their per-seed samples (r_b relative to the largest)."""
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
        """The vector of the seeds' means (`vector="raw"`) or their fit (`"fitted"`), with the evidence."""
        where = "RelationVector.from_seeds"
        check_arguments(where, vector=(vector, Choice(VECTORS)))
        if not isinstance(per_seed, dict) or not per_seed:
            raise ArgumentError(
                f"{where}: 'per_seed' must map each batch size to its seeds' samples to target, "
                f"got {per_seed!r}"
            )
        bs = sorted(per_seed)
        rows = [list(per_seed[b]) if isinstance(per_seed[b], (list, tuple)) else [] for b in bs]
        if any(not row for row in rows):
            raise ArgumentError(f"{where}: every batch size needs a list of one or more seeds' samples")
        rows = [
            [check_arguments(where, samples_to_target=(v, SAMPLES_KIND))["samples_to_target"] for v in row]
            for row in rows
        ]
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
        """The file's mapping: the fields, then the evidence."""
        d = {"schema": RELATION_SCHEMA, **{name: plain_json(getattr(self, name)) for name in FIELDS}}
        d["relation"] = self.relation
        d.update({k: plain_json(v) for k, v in self.extra.items() if k not in d})
        return d

    def save(self, path: str | Path) -> None:
        write_json(path, self.to_dict())

    def __post_init__(self) -> None:
        """Checked as a file is (`from_dict`); a bad entry is one ArgumentError line."""
        if not isinstance(self.extra, Mapping):
            raise ArgumentError(f"RelationVector: 'extra' must be a dict, got {shown(self.extra)}")
        if shadows := sorted(str(k) for k in self.extra if k in FIELDS or k in DERIVED):
            raise ArgumentError(
                f"RelationVector: 'extra' key {shadows[0]!r} is a field of the vector (or derived from "
                "them); give it as the field, or keep the evidence under another name"
            )
        try:  # the evidence as its file holds it and as the vector keeps it
            plain = plain_json(self.extra)
            json.dumps(plain, allow_nan=False)
            frozen = FrozenJson(plain)
        except (TypeError, ValueError) as exc:
            raise ArgumentError(
                f"RelationVector: 'extra' must hold JSON values (a file keeps them): {exc}"
            ) from None
        except RecursionError:
            raise ArgumentError("RelationVector: 'extra' is nested too deeply to be kept in a file") from None
        data = {**plain, **{name: getattr(self, name) for name in FIELDS}}
        for name in ("batch_sizes", "samples_to_target"):  # a tuple is read as the list a file holds
            data[name] = list(data[name]) if isinstance(data[name], tuple) else data[name]
        try:
            checked = _checked(data, "RelationVector")
        except FileFormatError as exc:
            raise ArgumentError(str(exc)) from None
        checked["extra"] = frozen
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "relation") -> RelationVector:
        return cls(**_checked(data, where))

    @classmethod
    def load(cls, path: str | Path) -> RelationVector:
        return cls.from_dict(read_json(path, RELATION_SCHEMA), str(path))


def _checked(data: dict[str, Any], where: str) -> dict[str, Any]:
    """A relation vector's fields from its file's mapping, checked (FileFormatError lines)."""
    f = Fields(data, where)
    target = f.value("target_accuracy", Number(0.0, 1.0, above=True))
    bs = f.list_of("batch_sizes")
    samples = f.list_of("samples_to_target")
    if not bs:
        raise f.fail("'batch_sizes' is empty")
    if len(bs) != len(samples):
        raise f.fail("'batch_sizes' and 'samples_to_target' differ in length")
    bs = [f.check("batch_sizes", b, BATCH_SIZE_KIND) for b in bs]
    if sorted(set(bs)) != bs:
        raise f.fail("'batch_sizes' must be strictly increasing (largest last)")
    values = [f.check("samples_to_target", s, SAMPLES_KIND) for s in samples]
    if not all(1e-9 <= v / values[-1] <= 1e9 for v in values):
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
            abs(f.check("relation", r, Number(0.0, above=True)) - w) > 1e-6 * max(1.0, w)
            for r, w in zip(rel, want, strict=True)
        ):
            wanted = ", ".join(f"{w:.4g}" for w in want)
            raise f.fail(
                f"'relation' {rel} is not samples_to_target divided by its last entry, [{wanted}]: "
                "correct it or leave it out (it is derived)"
            )
    known = {*FIELDS, *DERIVED}
    return {
        "model": f.value("model", Text()),
        "proxy_dataset": f.value("proxy_dataset", Text()),
        "target_accuracy": target,
        "batch_sizes": tuple(bs),
        "samples_to_target": tuple(values),
        "extra": {k: v for k, v in data.items() if k not in known},
    }


@dataclass(frozen=True)
class BatchEfficiencyFit:
    """samples(b) = e_min · (1 + b / b_crit) (McCandlish et al. 2018, "An Empirical Model of Large-Batch
    Training"), fitted by weighted least squares in relative error, slope ≥ 0."""

    batch_sizes: list[int]
    samples: list[float]
    e_min: float
    b_crit: float | None  # None: no growth measured (slope 0)
    chi2: float  # Σ ((mean − model) / standard error)² over batch sizes with a spread
    dof: int

    @property
    def explains(self) -> bool:
        """The model is within the seeds' noise: chi2 ≤ dof + 2·sqrt(2·dof) (about its 95th percentile)."""
        return self.dof > 0 and self.chi2 <= self.dof + 2 * math.sqrt(2 * self.dof)

    def to_dict(self) -> dict[str, Any]:
        """The fit as a relation file keeps it (`batch_efficiency`): its parameters and figures."""
        fit = {k: v for k, v in asdict(self).items() if k not in ("batch_sizes", "samples")}
        return {"model": "e_min*(1+b/b_crit)", **fit, "explains": self.explains}


def fit_batch_efficiency(
    batch_sizes: Sequence[int], per_seed: Sequence[Sequence[float]]
) -> BatchEfficiencyFit:
    """Fit samples(b) = a + c·b (c ≥ 0) to every seed's samples, weighted by 1 / (the batch size's mean)²."""
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
        if se > 0:
            chi2 += ((m - f) / se) ** 2
            dof += 1
    dof = max(0, dof - 2)
    b_crit = None if slope == 0 else (intercept / slope if intercept > 0 else 0.0)
    return BatchEfficiencyFit(bs, fitted, intercept, b_crit, chi2, dof)
