"""An action is a serialisable description: stage, params and the artifacts it reads."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from npubuild.cache.digest import canonical_json, sha256_json
from npubuild.errors import Location
from npubuild.labels import Label
from npubuild.stages import STAGES


@dataclass(frozen=True)
class SourceFile:
    """A file of the workspace; its digest comes from the stat cache."""

    path: Path
    display: str


@dataclass(frozen=True)
class Output:
    """One named output of another action."""

    action: Action
    name: str


Input = SourceFile | Output


@dataclass(eq=False)
class Action:
    stage: str
    params: dict[str, Any]
    inputs: dict[str, Input]
    owner: str  # the label (and role) this action is built for, e.g. "//data:calib"
    location: Location | None = None
    identity: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        # Plain JSON values only (tuples become lists), so a fresh analysis and a cached one agree.
        self.params = json.loads(canonical_json(self.params))
        refs = {
            name: ["src", str(i.path)] if isinstance(i, SourceFile) else ["out", i.action.identity, i.name]
            for name, i in self.inputs.items()
        }
        self.identity = sha256_json({"stage": self.stage, "params": self.params, "inputs": refs})

    @property
    def version(self) -> str:
        return STAGES[self.stage].code_version

    def key(self, input_digests: dict[str, str]) -> str:
        """sha256 over the stage, its code version, the params it reads and its input digests."""
        return sha256_json(
            {"stage": self.stage, "version": self.version, "params": self.params, "inputs": input_digests}
        )

    def describe(self, input_digests: dict[str, str], producer_keys: dict[str, str | None]) -> dict:
        """What a worker needs to run this action; plain JSON, so any worker can take it."""
        return {
            "stage": self.stage,
            "version": self.version,
            "params": self.params,
            "inputs": input_digests,
            "producers": producer_keys,
            "key": self.key(input_digests),
            "owner": self.owner,
        }


@dataclass
class TargetPlan:
    """What building one requested target means: its steps (shared actions) and its outputs."""

    label: Label
    kind: str
    steps: list[tuple[str, Action]] = field(default_factory=list)  # (step name, action), pipeline order
    outputs: list[tuple[Action, str, str]] = field(default_factory=list)  # (action, output, file name)
    notes: list[str] = field(default_factory=list)  # what the BUILD file left to a default a user should know
    gates: dict[str, float] = field(default_factory=dict)  # an npu_model's declared gates (npubuild test)
