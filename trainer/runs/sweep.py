"""Sweeps: many runs of one base config over a grid and/or random values, each an ordinary queued run.

A sweep file (YAML):

    base: config.yaml            # a config file (relative to the sweep file) or a config mapping
    name: lr-and-batch           # optional; default: the sweep file's name
    grid:                        # every combination
      optimizer.lr: [1e-3, 3e-3]
      data.batch_size: [32, 64]
    random:                      # `trials` draws (per grid point), reproducible from `seed`
      optimizer.weight_decay: {low: 1e-6, high: 1e-3, log: true}
    trials: 4
    seed: 0
    method: optuna               # optional: TPE + median pruning on the per-epoch metric (needs optuna)
    metric: val_acc              # optuna: the metric to optimise (val_acc is maximised, val_loss minimised)

Everything is checked before anything is queued: an unknown key, an empty grid, an invalid range or a value the
config refuses is an error naming it (exit 2).
"""

from __future__ import annotations

import copy
import itertools
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from trainer.core.config import MAX_SEED, ConfigError, RunConfig, apply_overrides, load_config, parse_float
from trainer.core.errors import InputError
from trainer.core.files import UserFileError
from trainer.core.user_yaml import YamlError, read_yaml_file

TOP_KEYS = {"base", "name", "grid", "random", "trials", "seed", "method", "metric"}
METHODS = ("grid", "random", "optuna")


MAX_TRIALS = 1000  # trials one sweep may have (README, docs/reliability.md)


class SweepError(InputError, ValueError):
    """A sweep file that cannot be run; the message names the file and the key at fault."""


@dataclass
class Sweep:
    name: str
    base: dict  # the base config, resolved, as a mapping
    grid: dict[str, list] = field(default_factory=dict)
    random: dict[str, dict] = field(default_factory=dict)
    trials: int = 1
    seed: int = 0
    method: str = "grid"
    metric: str = "val_acc"

    @property
    def size(self) -> int:
        """How many trials the sweep has (grid points x random draws), counted without building them."""
        points = math.prod(len(v) for v in self.grid.values()) if self.grid else 1
        return points * (self.trials if self.random else 1)

    def trials_values(self) -> list[dict]:
        """The overrides of each trial (dotted key -> value), in order: grid points × random draws."""
        return list(self.trial_values_iter())

    def trial_values_iter(self):
        """`trials_values` one at a time (the first is there without building the rest)."""
        keys = list(self.grid)
        points = (dict(zip(keys, combo)) for combo in itertools.product(*(self.grid[k] for k in keys))) \
            if keys else iter([{}])
        if not self.random:
            yield from points
            return
        rng = random.Random(self.seed)
        integer = {k: self._is_int(k) for k in self.random}
        for point in points:
            for _ in range(self.trials):
                yield {**point, **{k: draw(rng, spec, integer[k]) for k, spec in self.random.items()}}

    def _is_int(self, key: str) -> bool:
        node = RunConfig().to_dict()
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return isinstance(node, int) and not isinstance(node, bool)

    def config(self, values: dict) -> RunConfig:
        raw = copy.deepcopy(self.base)
        apply_overrides(raw, [f"{k}={yaml.safe_dump(v, default_flow_style=True).strip()}" for k, v in values.items()])
        return RunConfig.from_dict(raw, source=f"sweep {self.name}")


def draw(rng: random.Random, spec: dict, integer: bool):
    low, high = spec["low"], spec["high"]
    value = math.exp(rng.uniform(math.log(low), math.log(high))) if spec.get("log") else rng.uniform(low, high)
    return int(round(value)) if integer else float(f"{value:.6g}")


def is_sweep(raw: object) -> bool:
    """A parsed file is a sweep (it has `base`), not a run config."""
    return isinstance(raw, dict) and "base" in raw


def read_sweep(path: str | Path) -> Sweep:
    """Parse and check a sweep file; SweepError naming the file and key at fault."""
    path = Path(path)
    try:
        raw = read_yaml_file(path, "sweep file")
    except (YamlError, UserFileError) as e:
        raise SweepError(str(e)) from None
    return sweep_from(raw, path)


def sweep_from(raw: object, path: str | Path) -> Sweep:
    """The checked sweep of `raw` (the parsed file at `path`); SweepError naming the file and key at fault."""
    path = Path(path)
    if not isinstance(raw, dict):
        raise SweepError(f"{path}: expected a mapping with base and grid and/or random")
    unknown = sorted(set(raw) - TOP_KEYS)
    if unknown:
        raise SweepError(f"{path}: unknown key {unknown[0]} (allowed: {', '.join(sorted(TOP_KEYS))})")
    base = raw.get("base")
    try:
        if isinstance(base, str):
            base_path = Path(base) if Path(base).is_absolute() else path.parent / base
            base_cfg = load_config(base_path)
        elif isinstance(base, dict):
            base_cfg = RunConfig.from_dict(base, source=f"{path}: base").resolve_paths(path.parent)
        else:
            raise SweepError(f"{path}: base: give a config file or a config mapping")
    except ConfigError as e:
        raise SweepError(f"{path}: base: {e}") from e
    grid, rand = raw.get("grid") or {}, raw.get("random") or {}
    if "grid" in raw and not grid:
        raise SweepError(f"{path}: grid: empty (map config keys to lists of values)")
    if not grid and not rand:
        raise SweepError(f"{path}: nothing to sweep: give grid and/or random")
    if not isinstance(grid, dict) or not isinstance(rand, dict):
        raise SweepError(f"{path}: grid and random map dotted config keys (optimizer.lr) to values")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise SweepError(f"{path}: grid.{key}: give a non-empty list of values")
    for key, spec in rand.items():
        rand[key] = _check_range(path, key, spec)
    method = raw.get("method", "random" if rand else "grid")
    if method not in METHODS:
        raise SweepError(f"{path}: method: {method!r} is not one of {', '.join(METHODS)}")
    trials = raw.get("trials", 1)
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        raise SweepError(f"{path}: trials: must be a whole number >= 1, got {trials!r}")
    seed = raw.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
        raise SweepError(f"{path}: seed: must be a whole number from 0 to {MAX_SEED}, got {seed!r}")
    metric = raw.get("metric", "val_acc")
    if metric not in ("val_acc", "val_loss"):
        raise SweepError(f"{path}: metric: must be val_acc or val_loss, got {metric!r}")
    if method == "optuna" and (grid or not rand):
        raise SweepError(f"{path}: method optuna searches the random: ranges (and takes no grid)")
    sweep = Sweep(str(raw.get("name") or path.stem), base_cfg.to_dict(), grid, rand, trials, seed, method, metric)
    if sweep.size > MAX_TRIALS:
        raise SweepError(f"{path}: {sweep.size:,} trials (the grid's points x trials); a sweep queues at most "
                         f"{MAX_TRIALS:,}: split it into smaller sweeps")
    first = next(iter(sweep.trial_values_iter()), {})
    for values in [first] + _extremes(sweep):  # every key and value the config accepts
        try:
            sweep.config(values)
        except ConfigError as e:
            raise SweepError(f"{path}: {e}") from e
    return sweep


def _extremes(sweep: Sweep) -> list[dict]:
    """Each grid value and each range end once, so a value the config refuses is found before queueing."""
    out = [{k: v} for k, values in sweep.grid.items() for v in values]
    out += [{k: (int(s[b]) if sweep._is_int(k) else s[b])} for k, s in sweep.random.items() for b in ("low", "high")]
    return out


def _check_range(path: Path, key: str, spec) -> dict:
    if not isinstance(spec, dict) or set(spec) - {"low", "high", "log"} or not {"low", "high"} <= set(spec):
        raise SweepError(f"{path}: random.{key}: give {{low, high}} and optionally log: true")
    try:
        low, high = parse_float(spec["low"]), parse_float(spec["high"])
    except (TypeError, ValueError) as e:
        raise SweepError(f"{path}: random.{key}: low and high must be numbers ({e})") from e
    if not low < high:
        raise SweepError(f"{path}: random.{key}: low ({low:g}) must be below high ({high:g})")
    if spec.get("log") and low <= 0:
        raise SweepError(f"{path}: random.{key}: a log range needs low > 0, got {low:g}")
    return {"low": low, "high": high, "log": bool(spec.get("log"))}


def queue_sweep(sweep: Sweep, runs_dir: Path) -> list:
    """Queue every trial of a grid or random sweep (checked first: all or nothing); their run directories."""
    from trainer.runs import queue
    from trainer.train.preflight import preflight

    items = []
    for i, values in enumerate(sweep.trials_values(), start=1):
        try:
            cfg = sweep.config(values)
            preflight(cfg)
        except InputError as e:
            raise SweepError(f"sweep {sweep.name}: {values}: {e}") from e
        items.append((cfg, f"{sweep.name}-{i:03d}", values))
    return queue.add_many(runs_dir, items, sweep=sweep.name, checked=True)
