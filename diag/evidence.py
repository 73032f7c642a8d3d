"""The evidence one training run leaves behind, as plain data.

Everything triage reasons over arrives in one `Evidence`: the resolved config, the metric
histories, the run's tags and the L0 static check results. `runner` fills it (from MLflow or a
live job); `diag` only reads it, so a diagnosis can be tested on crafted numbers.
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass, field
from typing import Any

Points = list[tuple[int, float]]
"""A metric history: (step, value) pairs, step = tokens seen, sorted by step."""

OUTCOME_TAG = "hyprun.outcome"
"""Tag naming how the job ended: completed | diverged | interrupted."""
NAN_MODULE_TAG = "hyprun.nan_module"
"""Tag naming the first module whose output went non-finite (e.g. `blocks.1.mlp.fc`)."""
NAN_UPDATES_TAG = "hyprun.nan_after_updates"
"""Tag counting the optimizer updates this run applied before its first non-finite loss: 0 is
a forward that is non-finite on the weights the run started from, which no LR can have caused."""

DEVICE_TAG = "hyprun.device"
"""Tag naming the device type the job ran on: cpu | cuda."""

_BLOCK = re.compile(r"^blocks\.(\d+)$")


def plain(x: Any) -> Any:
    """A JSON-ready copy: numpy scalars become int/float, NaN and infinities are spelled as
    strings ("nan", "inf"), which `float()` reads back."""
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if isinstance(x, numbers.Real) and not isinstance(x, bool) and type(x).__name__ != "bool_":
        x = int(x) if isinstance(x, numbers.Integral) else float(x)
        return x if math.isfinite(x) else str(x)
    return x


@dataclass
class Evidence:
    """One run's config, metric histories, tags and static check results."""

    config: dict[str, Any] = field(default_factory=dict)
    """The job's resolved config as a plain nested dict."""
    series: dict[str, Points] = field(default_factory=dict)
    """Metric histories by key (`train/loss`, `grad/norm/blocks.0`, ...); step = tokens seen."""
    tags: dict[str, str] = field(default_factory=dict)
    """Run tags, e.g. `hyprun.outcome` and `hyprun.nan_module`."""
    static: list[dict[str, Any]] = field(default_factory=list)
    """L0 check results: {"id", "status" (pass|warn|fail|skip), "value", "threshold", "why",
    "question"}."""

    def cfg(self, dotted: str, default: Any = None) -> Any:
        """A config value by dotted path (`optim.lr`); a flat key spelled with dots also works,
        since MLflow params arrive flattened."""
        if dotted in self.config:
            return self.config[dotted]
        node: Any = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def points(self, key: str) -> Points:
        """The history of `key`, sorted by step; empty when it was not logged."""
        return sorted(self.series.get(key, []), key=lambda p: p[0])

    def per_block(self, prefix: str) -> dict[str, Points]:
        """Histories of `<prefix>/blocks.<i>`, keyed `blocks.<i>` in block order: per-layer
        metrics are compared across depth, so their order matters."""
        found: list[tuple[int, str, Points]] = []
        for key, pts in self.series.items():
            if not key.startswith(prefix + "/"):
                continue
            module = key[len(prefix) + 1 :]
            match = _BLOCK.match(module)
            if match and pts:
                found.append((int(match.group(1)), module, sorted(pts, key=lambda p: p[0])))
        return {module: pts for _, module, pts in sorted(found)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Evidence:
        """Rebuild from `to_dict()` output (JSON turns tuples into lists)."""
        series = {
            k: [(int(s), float(v)) for s, v in pts] for k, pts in data.get("series", {}).items()
        }
        return cls(
            config=dict(data.get("config", {})),
            series=series,
            tags={str(k): str(v) for k, v in data.get("tags", {}).items()},
            static=[dict(c) for c in data.get("static", [])],
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        return plain(
            {
                "config": self.config,
                "series": {k: [[s, v] for s, v in pts] for k, pts in self.series.items()},
                "tags": self.tags,
                "static": self.static,
            }
        )
