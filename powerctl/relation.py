"""The relation vector: samples to the target accuracy per batch size — `powerctl.relation/1`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from powerctl.jsonfile import Fields, check_number, read_json, write_json

RELATION_SCHEMA = "powerctl.relation/1"


@dataclass
class RelationVector:
    """`relation[i] = samples_to_target[i] / samples_to_target[last]`, largest batch size last."""

    model: str
    proxy_dataset: str
    target_accuracy: float
    batch_sizes: list[int]
    samples_to_target: list[float]
    extra: dict[str, Any] = field(default_factory=dict)

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

    def as_map(self) -> dict[int, float]:
        """Batch size → r_b."""
        return dict(zip(self.batch_sizes, self.relation, strict=True))

    def samples_map(self) -> dict[int, float]:
        return dict(zip(self.batch_sizes, self.samples_to_target, strict=True))

    @classmethod
    def from_samples(
        cls, model: str, proxy_dataset: str, target_accuracy: float, samples: dict[int, float], **extra: Any
    ) -> RelationVector:
        bs = sorted(samples)
        return cls(model, proxy_dataset, target_accuracy, bs, [float(samples[b]) for b in bs], dict(extra))

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "schema": RELATION_SCHEMA,
            "model": self.model,
            "proxy_dataset": self.proxy_dataset,
            "target_accuracy": self.target_accuracy,
            "batch_sizes": list(self.batch_sizes),
            "samples_to_target": list(self.samples_to_target),
            "relation": self.relation,
        }
        d.update(self.extra)
        return d

    def save(self, path: str | Path) -> None:
        write_json(path, self.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "relation") -> RelationVector:
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
            if isinstance(b, bool) or not isinstance(b, int) or b < 1:
                raise f.fail(f"batch sizes must be positive integers, got {b!r}")
        if sorted(set(bs)) != bs:
            raise f.fail("'batch_sizes' must be strictly increasing (largest last)")
        values = [check_number(s, "samples_to_target", f, positive=True) for s in samples]
        if "relation" in data:
            rel = f.list_of("relation")
            want = [v / values[-1] for v in values]
            if len(rel) != len(values) or any(
                abs(check_number(r, "relation", f, positive=True) - w) > 1e-6 * max(1.0, w)
                for r, w in zip(rel, want, strict=True)
            ):
                shown = ", ".join(f"{w:.4g}" for w in want)
                raise f.fail(
                    f"'relation' {rel} is not samples_to_target divided by its last entry, [{shown}]: "
                    "correct it or leave it out (it is derived)"
                )
        known = {
            "schema",
            "model",
            "proxy_dataset",
            "target_accuracy",
            "batch_sizes",
            "samples_to_target",
            "relation",
        }
        return cls(
            model=f.string("model"),
            proxy_dataset=f.string("proxy_dataset"),
            target_accuracy=target,
            batch_sizes=list(bs),
            samples_to_target=values,
            extra={k: v for k, v in data.items() if k not in known},
        )

    @classmethod
    def load(cls, path: str | Path) -> RelationVector:
        return cls.from_dict(read_json(path, RELATION_SCHEMA), str(path))
