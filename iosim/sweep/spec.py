"""A sweep's spec: a TOML file of profiles (with what-if values or scalings of their fields) x layers x
algorithms x passes, expanded into points.

    [sweep]
    profiles = ["a100_80gb", "h100_sxm"]        # built-in names or .toml paths
    algorithms = ["naive", "flash2"]
    passes = ["forward", "forward+backward"]

    [what_if]                                    # each field's values replace the profile's (a product)
    smem_per_sm_kib = [64, 128, 256, 512]
    [what_if.scale]                              # each field multiplied by each factor (a product)
    hbm_bandwidth_gb_s = [0.5, 1, 2]

    [[layers]]                                   # AttentionConfig's fields; a list is a product over its values
    name = "gpt2-medium"
    batch = 8
    heads = 16
    seqlen_q = [1024, 2048, 4096]
    head_dim = 64
    causal = [false, true]

A point is (profile, what-if, layer, algorithm, pass); its `point_id` is a hash of exactly that, so a sweep run
again, or resumed, knows which points it already has.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import IosimError, one_line
from ..hardware import HardwareProfile, load_profile
from ..plan import ALGORITHMS
from ..workload import PASS_NAMES, AttentionConfig

LAYER_FIELDS = tuple(f for f in AttentionConfig.model_fields if f != "pass_")


class SweepSpec(BaseModel):
    """The parsed spec (see the module's docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profiles: list[str] = Field(min_length=1)
    algorithms: list[str] = Field(default=["naive", "flash2"], min_length=1)
    passes: list[str] = Field(default=["forward"], min_length=1)
    what_if: dict[str, list[float]] = Field(default_factory=dict)
    scale: dict[str, list[float]] = Field(default_factory=dict)
    layers: list[dict[str, Any]] = Field(min_length=1)

    @field_validator("algorithms")
    @classmethod
    def _algorithms(cls, v: list[str]) -> list[str]:
        for a in v:
            if a not in ALGORITHMS:
                raise ValueError(f"unknown algorithm '{a}'; choose from {', '.join(ALGORITHMS)}")
        return v

    @field_validator("passes")
    @classmethod
    def _passes(cls, v: list[str]) -> list[str]:
        allowed = set(PASS_NAMES.values())
        out = [PASS_NAMES.get(p, p) for p in v]
        for p in out:
            if p not in allowed:
                raise ValueError(f"unknown pass '{p}'; choose from forward, backward, forward+backward "
                                 f"(or {', '.join(PASS_NAMES)})")
        return out

    @field_validator("layers")
    @classmethod
    def _layers(cls, v: list[dict]) -> list[dict]:
        for i, layer in enumerate(v):
            for k in layer:
                if k != "name" and k not in LAYER_FIELDS:
                    raise ValueError(f"layers[{i}]: unknown field '{k}'; known: name, {', '.join(LAYER_FIELDS)}")
        return v


def load_spec(path: str | Path) -> SweepSpec:
    p = Path(path)
    if not p.is_file():
        raise IosimError(f"sweep spec not found: {p}")
    try:
        raw = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise IosimError(f"{p}: not valid TOML: {e}") from None
    return parse_spec(raw, str(p))


def parse_spec(raw: dict, where: str = "spec") -> SweepSpec:
    unknown = set(raw) - {"sweep", "what_if", "layers"}
    if unknown:
        raise IosimError(f"{where}: unknown table(s) {', '.join(sorted(unknown))}; a spec has [sweep], [what_if] "
                         "and [[layers]]")
    what_if = dict(raw.get("what_if", {}))
    scale = what_if.pop("scale", {})
    data = dict(raw.get("sweep", {})) | {"what_if": what_if, "scale": scale, "layers": raw.get("layers", [])}
    try:
        spec = SweepSpec(**data)
    except ValidationError as e:
        raise IosimError(one_line(e, where)) from None
    for kind, fields in (("what_if", spec.what_if), ("what_if.scale", spec.scale)):
        for k, values in fields.items():
            if k not in HardwareProfile.quantity_fields():
                raise IosimError(f"{where}: {kind}: unknown profile field '{k}'")
            if not values:
                raise IosimError(f"{where}: {kind}.{k}: give at least one value")
    return spec


def _product(table: dict[str, list]) -> list[dict]:
    keys = list(table)
    return [dict(zip(keys, vals)) for vals in itertools.product(*(table[k] for k in keys))]


def variants(spec: SweepSpec) -> list[dict]:
    """Every what-if point: {field: ('set', value) | ('scale', factor)} (one empty point where none is given)."""
    sets = [{k: ("set", v) for k, v in p.items()} for p in _product(spec.what_if)]
    scales = [{k: ("scale", f) for k, f in p.items()} for p in _product(spec.scale)]
    return [a | b for a in sets for b in scales]


def apply(hw: HardwareProfile, change: dict) -> HardwareProfile:
    """`hw` with a what-if point applied; an impossible value is one line naming the field and its range."""
    if not change:
        return hw
    values = {k: v for k, (how, v) in change.items() if how == "set"}
    factors = {k: f for k, (how, f) in change.items() if how == "scale"}
    for k, f in factors.items():
        base = values.get(k, getattr(hw, k))
        if base is None:
            raise IosimError(f"what_if.scale.{k}: profile '{hw.key}' gives no {k} to scale")
        values[k] = type(base)(base * f) if isinstance(base, int) and float(base * f).is_integer() else base * f
    note = ", ".join(f"{k} x{f:g}" for k, f in factors.items())
    return hw.replace(note=note, **values)


def layers(spec: SweepSpec) -> list[tuple[str, dict]]:
    """(name, AttentionConfig fields) of every layer point, lists expanded."""
    out = []
    for i, layer in enumerate(spec.layers):
        name = layer.get("name", f"layer{i}")
        fields = {k: v if isinstance(v, list) else [v] for k, v in layer.items() if k != "name"}
        for point in _product(fields):
            out.append((name, point))
    return out


def points(spec: SweepSpec) -> list[dict]:
    """Every point of the sweep, each checked (its config and what-if profile valid) and with its `point_id`."""
    profiles = {p: load_profile(p) for p in spec.profiles}
    hws = {}
    for p, hw in profiles.items():
        for v in variants(spec):
            hws[(p, json.dumps(v, sort_keys=True))] = apply(hw, v)
    configs = []
    for name, fields in layers(spec):
        for pass_ in spec.passes:
            cfg = AttentionConfig.make(**fields, **{"pass": pass_})
            configs.append((name, fields, cfg))
    out = []
    for (p, v), hw in hws.items():
        for name, fields, cfg in configs:
            for alg in spec.algorithms:
                key = {"profile": p, "what_if": json.loads(v), "layer": fields, "pass": cfg.pass_, "algorithm": alg}
                pid = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
                out.append({"point_id": pid, "profile": p, "what_if": v, "layer": name, "config": cfg,
                            "algorithm": alg, "hw": hw})
    return out
