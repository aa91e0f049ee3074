"""A tuning campaign's search space: which profile fields vary, under what traffic, for which goal.

Engine layer: never prints.
- `load(path)` reads a space file as a profile is read: YAML 1.2, pydantic, every problem named
  with its fix.
- `expand(space)` turns the grid of its `vary` values into points. Each point is a derived profile
  that went through every profile rule, and systemd's reading of its unit. Or it is pruned, with the
  rule's own message.
- `json_schema.of(Space)` is the file's JSON Schema (`orchestrator schema space`).

A space file:

    extends: cg_5tok                 # every trial is this profile with the varied fields set
    baseline: baseline               # measured on every host; speed-ups are against it
    vary:
      speculative.num_steps: [1, 2, 3, 5]
      speculative.eagle_topk: [1, 2, 4]
      speculative.num_draft_tokens: [2, 4, 5, 8, 16]
    traffic: {endpoint: chat, dataset: prompts/chat.jsonl, concurrency: [1, 8, 32], max_tokens: 256}
    objective: {maximize: tok_s, at_concurrency: 8, p99_ttft_ms_max: 2000}
    # or: {minimize: p99_ttft_ms, at_concurrency: 8, total_tok_s_min: 400}
    # or: {goodput: {p99_ttft_ms: 2000, p99_itl_ms: 50}} over a request_rate curve
    budget: {restarts: 16}
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import os
import re
import stat
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from orchestrator.errors import InputError, Problem, ProfileError
from orchestrator.profile import model as profile_mod
from orchestrator.profile import yaml12
from orchestrator.render import launch, systemd_check
from orchestrator.tuning import bench as bench_mod

#: Counts and numbers as a profile takes them (strict; a number YAML 1.1 reads otherwise refused).
Int = profile_mod.Int
Number = profile_mod.Number


def _scalar(value: Any) -> Any:
    """A varied value is what the profile file would say at that field: a scalar (null: the
    default). It is kept as read, so a number keeps its text (yaml12): `1.10` stays "1.10" in
    an environment variable, not the 1.1 a number type would make of it."""
    if value is not None and not isinstance(value, bool | int | float | str):
        raise ValueError(
            f"{type(value).__name__} is not a single value: give scalars (a number, text, true/false, null)"
        )
    return value


#: One value a varied field takes, as read.
Value = Annotated[Any, AfterValidator(_scalar)]

#: Profile fields a campaign may not vary: what names the trial, secrets (every trial of a
#: campaign runs on the same hosts with the same credentials), the unit (one unit, one lock a
#: host) and the deployment's shape (a trial is one host: never a multi-node server).
FIXED = (
    "name",
    "description",
    "extends",
    "api_key",
    "secret_env",
    "service.environment_files",
    "service.unit_name",
    "deployment",
)
#: Most points a space may expand to (a 4 x 3 x 5 grid is 60).
MAX_POINTS = 1024


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SpaceTraffic(_Model):
    """What every trial is benched with: bench's options, as a mapping."""

    endpoint: Literal["generate", "chat", "completions"] = Field(
        "generate", description="generate (raw text), chat (the chat template applies) or completions."
    )
    dataset: str | None = Field(
        None, description="Prompts file (ShareGPT JSON, OpenAI JSONL, ...), relative to the space file."
    )
    concurrency: list[Annotated[Int, Field(ge=1, le=1024)]] = Field(
        default_factory=lambda: [1], min_length=1, description="Closed-loop levels: the curve."
    )
    request_rate: list[Annotated[Number, Field(ge=0.001, le=100000)]] | None = Field(
        None, min_length=1, description="Open-loop levels (requests/s) instead of concurrency."
    )
    requests: Int = Field(16, ge=1, le=100000, description="Requests per run.")
    max_tokens: Int = Field(256, ge=2, le=1_000_000, description="Per request.")
    warmup: Int = Field(2, ge=0, le=1000, description="Warm-up requests before each run.")
    temperature: Number = Field(0.0, ge=0, le=2, description="Sampling temperature.")
    seed: Int = Field(0, ge=0, le=2**31 - 1, description="Which prompts, and the arrival times.")
    repeat: Int = Field(
        3, ge=1, le=50, description="Runs per level of a full measurement (intervals need 2 or more)."
    )

    @model_validator(mode="after")
    def _one_curve(self) -> SpaceTraffic:
        for name in ("concurrency", "request_rate"):
            levels = getattr(self, name) or []
            twice = sorted({v for v in levels if levels.count(v) > 1})
            if twice:  # bench refuses a level given twice: one curve, each level once
                raise ValueError(
                    f"{name} gives {', '.join(f'{v:g}' for v in twice)} more than once: give each level once"
                )
        if self.request_rate and len(self.concurrency) > 1:
            raise ValueError(
                "request_rate with a concurrency list: give a curve of one or the other "
                "(one concurrency with request_rate caps the requests in flight)"
            )
        return self


class Goodput(_Model):
    """The p99 limits that goodput keeps: the most load under them is the score."""

    p99_ttft_ms: Number | None = Field(None, gt=0, description="Limit on p99 time to first token.")
    p99_itl_ms: Number | None = Field(None, gt=0, description="Limit on p99 inter-token latency.")

    @model_validator(mode="after")
    def _one_limit(self) -> Goodput:
        if self.p99_ttft_ms is None and self.p99_itl_ms is None:
            raise ValueError("goodput needs a limit: give p99_ttft_ms, p99_itl_ms or both")
        return self


class Objective(_Model):
    """What a trial is scored by: one metric at one level of the traffic's curve, or goodput over
    the whole curve. One of maximize, minimize and goodput (default: maximize tok_s)."""

    maximize: Literal["tok_s", "total_tok_s"] | None = Field(
        None,
        description="tok_s: decode tok/s of one request (what a user sees); total_tok_s: output "
        "tok/s of all requests together (what the fleet serves). The default is tok_s.",
    )
    minimize: Literal["p99_ttft_ms", "p99_itl_ms"] | None = Field(
        None, description="A latency at the scored level; pair it with a throughput floor."
    )
    goodput: Goodput | None = Field(
        None,
        description="The most load (request rate or concurrency) whose p99 figures keep these limits, "
        "read off the traffic's curve.",
    )
    at_concurrency: Int | None = Field(None, description="The level scored; default the curve's first.")
    at_request_rate: Number | None = Field(None, description="With request_rate: the level scored.")
    p99_ttft_ms_max: Number | None = Field(
        None, gt=0, description="A trial over this p99 time to first token at that level does not count."
    )
    tok_s_min: Number | None = Field(
        None, gt=0, description="A trial under this decode tok/s of one request at that level does not count."
    )
    total_tok_s_min: Number | None = Field(
        None, gt=0, description="A trial under this total tok/s at that level does not count."
    )

    @model_validator(mode="after")
    def _one_goal(self) -> Objective:
        given = [k for k in ("maximize", "minimize", "goodput") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give one of maximize, minimize and goodput, not {' and '.join(given)}")
        if self.goodput is not None and (self.at_concurrency is not None or self.at_request_rate is not None):
            raise ValueError("goodput is read off the whole curve: drop at_concurrency / at_request_rate")
        one_level = [
            k for k in ("p99_ttft_ms_max", "tok_s_min", "total_tok_s_min") if getattr(self, k) is not None
        ]
        if self.goodput is not None and one_level:
            raise ValueError(
                f"{', '.join(one_level)} is a limit at one level, and goodput has none: put p99 limits in "
                "goodput itself (p99_ttft_ms, p99_itl_ms), or drop it"
            )
        return self


class Budget(_Model):
    restarts: Int = Field(
        16,
        ge=1,
        le=10000,
        description="Server restarts in all: the baseline, trials and the leaders' repeats.",
    )


class Search(_Model):
    sampler: Literal["model", "grid", "random"] = Field(
        "model",
        description="model: a model of speculative decoding fitted to every trial's measurements "
        "chooses (the default); grid: every point in turn; random: points in a seeded order.",
    )
    seed: Int | None = Field(
        None, ge=0, le=2**32 - 1, description="The seed (0 to 2**32-1): the same seed makes the same choices."
    )
    startup_trials: Int = Field(
        3,
        ge=1,
        le=1000,
        description="Points spread over the space (the space's own first) before the model chooses.",
    )

    @field_validator("sampler", mode="before")
    @classmethod
    def _tpe_is_gone(cls, value: Any) -> Any:
        if value == "tpe":
            raise ValueError(
                "tpe is no longer a sampler: `model` (the default) fits speculative decoding's own "
                "structure to what each trial measures; drop the line or say `model`"
            )
        return value

    early_stop: bool = Field(
        True,
        description="Measure each trial briefly first (one run at the scored level) and stop one that "
        "is clearly behind the best so far; the rest get the full curve.",
    )
    confirm: Int = Field(
        6, ge=0, le=100, description="Most extra runs each of the two leaders gets to separate them."
    )


class Space(_Model):
    """A tuning campaign's search space file."""

    extends: str = Field(description="The profile every trial derives from (a name or a path).")
    baseline: str = Field(
        "baseline", description="Measured once, on the first host free; every gain is against it."
    )
    vary: dict[str, list[Value]] = Field(
        min_length=1,
        description="Dotted profile fields (speculative.num_steps, server.cuda_graph, nccl.NCCL_ALGO) "
        "and the values each takes; null is the field's default.",
    )
    traffic: SpaceTraffic = Field(default_factory=lambda: SpaceTraffic())
    objective: Objective = Field(default_factory=lambda: Objective())
    budget: Budget = Field(default_factory=lambda: Budget())
    search: Search = Field(default_factory=lambda: Search())
    description: str = Field("", description="What this campaign is for.")

    @model_validator(mode="after")
    def _levels(self) -> Space:
        t, o = self.traffic, self.objective
        if o.goodput is not None and len(t.request_rate or t.concurrency) < 2:
            raise ValueError(
                "objective.goodput reads the most load that keeps its limits off a curve: give "
                "traffic.request_rate (or traffic.concurrency) two levels or more"
            )
        if t.request_rate:
            if o.at_concurrency is not None:
                raise ValueError("objective.at_concurrency with traffic.request_rate: use at_request_rate")
            if o.at_request_rate is not None and o.at_request_rate not in t.request_rate:
                raise ValueError(
                    f"objective.at_request_rate {o.at_request_rate:g} is not a level of traffic.request_rate "
                    f"({', '.join(f'{r:g}' for r in t.request_rate)})"
                )
        else:
            if o.at_request_rate is not None:
                raise ValueError("objective.at_request_rate needs traffic.request_rate")
            if o.at_concurrency is not None and o.at_concurrency not in t.concurrency:
                raise ValueError(
                    f"objective.at_concurrency {o.at_concurrency} is not a level of traffic.concurrency "
                    f"({', '.join(map(str, t.concurrency))}): add it there or pick one of them"
                )
        return self


# --- the points ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """One combination of the varied values, as a derived profile or pruned by a rule."""

    #: dotted field -> value, in the space's order
    params: dict[str, Value]
    #: the trial's profile name: the base's name and the values (cg_5tok.3-4-5)
    name: str
    profile: profile_mod.Profile | None = None
    #: the rules' messages where the profile is refused
    pruned: str = ""

    @property
    def key(self) -> str:
        """The point's identity in the ledger: its values as JSON."""
        return point_key(self.params)

    @property
    def label(self) -> str:
        """`num_steps=3 eagle_topk=4`: the last part of each field and its value."""
        return label(self.params)


def point_key(params: dict[str, Any]) -> str:
    """The values as JSON, a number as the text it was written with (`1.10`, not 1.1): two
    values that mean two settings are two points."""
    return json.dumps({k: _as_written(v) for k, v in params.items()}, sort_keys=True, separators=(",", ":"))


def _as_written(value: Any) -> Any:
    return str(value) if isinstance(value, yaml12.Int | yaml12.Float) else value


def label(params: dict[str, Any]) -> str:
    return " ".join(f"{k.rsplit('.', 1)[-1]}={_text(v)}" for k, v in params.items())


def _text(value: Value) -> str:
    if value is None:
        return "default"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _name(base: str, params: dict[str, Value], hashed: bool = False) -> str:
    """A profile name that shows the point: `cg_5tok.3-4-5`, `cg_5tok.on-Ring`."""
    parts = [re.sub(r"[^A-Za-z0-9_.]", "_", _text(v)) for v in params.values()]
    name = f"{base}.{'-'.join(parts)}"
    if hashed:
        name += "." + hashlib.sha256(point_key(params).encode()).hexdigest()[:6]
    if len(name) > 80:  # a long text value: keep it a name, still one per point
        name = f"{base}.{hashlib.sha256(point_key(params).encode()).hexdigest()[:10]}"
    return name


@dataclass(frozen=True)
class Expanded:
    """A space file read and its grid expanded: what `tune --check` lists."""

    space: Space
    path: Path
    #: the space file's bytes' digest: a resumed campaign must read the same file
    digest: str
    base: profile_mod.Profile
    baseline: profile_mod.Profile
    points: list[Point]
    traffic: bench_mod.Traffic

    @property
    def valid(self) -> list[Point]:
        return [p for p in self.points if p.profile is not None]

    @property
    def pruned(self) -> list[Point]:
        return [p for p in self.points if p.profile is None]

    @property
    def incumbent(self) -> Point | None:
        """The valid point that runs as the space's own profile does (every varied field at the
        value it has there), if the space holds one: a campaign measures it first, so the verdict
        says whether anything beats what runs today."""
        mine = _settings(self.base)
        return next((p for p in self.valid if p.profile is not None and _settings(p.profile) == mine), None)

    def level(self) -> bench_mod.Settings:
        """The traffic's level the objective scores."""
        o, levels = self.space.objective, self.traffic.levels()
        for s in levels:
            if s.request_rate is not None and s.request_rate == o.at_request_rate:
                return s
            if s.request_rate is None and s.concurrency == o.at_concurrency:
                return s
        return levels[0]


def _settings(prof: profile_mod.Profile) -> dict[str, Any]:
    """What a profile runs, without what only names it."""
    return prof.model_dump(exclude={"name", "description", "extends"})


#: what a space file misses, in its own words (a profile's would suggest `extends: base`)
REQUIRED = {
    "extends": "required: the profile whose fields vary (a name, example:NAME or a path)",
    "vary": "required: the fields to vary, each with its values",
}


def load(path: Path) -> Space:
    """The space file, validated; every problem at once (ProfileError), as a profile's."""
    try:
        regular = stat.S_ISREG(path.stat().st_mode)
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror or exc}") from None
    if not regular:  # a FIFO would block the read forever
        raise InputError(f"{path}: not a regular file (a FIFO, a device): name a space file")
    data = profile_mod._read_yaml(path)
    source = str(path)
    try:
        space = Space.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            if err["type"] == "missing" and len(err["loc"]) == 1:
                name = str(err["loc"][0])
                problems.append(Problem(source, name, REQUIRED.get(name, "required in a space file: add it")))
            else:
                problems.append(profile_mod._problem_from_pydantic(err, source, data, Space))
        raise ProfileError(profile_mod._dedupe(problems)) from None
    problems = [Problem(source, f"vary.{field}", why) for field, why in _field_problems(space)]
    if problems:
        raise ProfileError(problems)
    return space


def _field_problems(space: Space) -> list[tuple[str, str]]:
    """Each varied field must be a profile field the campaign may set, with distinct values."""
    found = []
    total = 1
    for field, values in space.vary.items():
        why = _field_problem(field)
        if why:
            found.append((field, why))
        if not values:
            found.append((field, "give at least one value"))
        texts = [json.dumps(_as_written(v)) for v in values]
        twice = sorted({_text(v) for v, t in zip(values, texts, strict=True) if texts.count(t) > 1})
        if twice:
            found.append((field, f"{', '.join(twice)} given twice: each value once"))
        total *= max(len(values), 1)
    if total > MAX_POINTS:
        found.append(("", f"the grid has {total} points, over {MAX_POINTS}: vary fewer fields or values"))
    return found


def _field_problem(field: str) -> str:
    """Why `field` is not a dotted profile field a campaign may vary ('' when it is)."""
    parts = field.split(".")
    fixed = next((f for f in FIXED if field == f or field.startswith(f + ".")), None)
    if fixed:
        return f"{fixed} is the same for every trial of a campaign; set it in the extended profile"
    model: type[BaseModel] | None = profile_mod.Profile
    for i, part in enumerate(parts):
        if model is None:  # inside a mapping (nccl, env): any key, nothing below it
            if i < len(parts) - 1:
                head, below = ".".join(parts[:i]), ".".join(parts[i:])
                return f"{head} maps a key to a plain value: {below} is not one key (vary {head}.{part})"
            return ""
        fields = model.model_fields
        if part not in fields:
            close = difflib.get_close_matches(part, list(fields), n=1, cutoff=0.6)
            hint = f"did you mean '{close[0]}'?" if close else f"known: {', '.join(fields)}"
            where = ".".join(parts[:i]) or "a profile"
            return f"{where} has no field {part!r}: {hint}"
        ann = fields[part].annotation
        members = [a for a in getattr(ann, "__args__", (ann,)) if isinstance(a, type)]
        sub = next((a for a in members if issubclass(a, BaseModel)), None)
        mapping = getattr(ann, "__origin__", None) is dict
        if sub is None and not mapping and i < len(parts) - 1:
            return f"{'.'.join(parts[: i + 1])} is a value, not a section: nothing below it"
        if sub is not None and i == len(parts) - 1:
            return f"{field} is a section: name one of its fields ({', '.join(sub.model_fields)})"
        model = sub
    return ""


def _set(data: dict[str, Any], field: str, value: Value, keep_null: bool = False) -> None:
    """`data` with the dotted field set (null: removed, so the default applies; `keep_null`: an
    explicit null, which a profile that extends another reads as "the default" too)."""
    *path, last = field.split(".")
    node = data
    for part in path:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    if value is None and not keep_null:
        node.pop(last, None)
    else:
        node[last] = value


def _copy(value: Any) -> Any:
    """Mappings and lists copied, scalars shared (yaml12's numbers keep their text and are
    immutable, but do not deepcopy)."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _ref(ref: str, space_path: Path) -> str:
    """A profile reference in a space file, spelled as `extends:` in a profile is: a path is
    relative to the space file."""
    return profile_mod._parent_ref(ref, space_path)


def expand(path: Path, on_point: Callable[[int], None] | None = None) -> Expanded:
    """The space file read, its base and baseline profiles loaded, and every point derived and
    checked (the rules, then systemd's reading of the unit), before any host is touched.
    `on_point(total)` after each point (a progress display: a large space takes a while)."""
    space = load(path)
    digest = hashlib.sha256(yaml12.read_bytes(path)).hexdigest()[:16]
    base_ref = _ref(space.extends, path)
    try:
        base_data, _ = profile_mod.load_raw(base_ref)
        base = profile_mod.validate(base_data, source=f"{path}: extends {space.extends}")
        baseline = profile_mod.load(_ref(space.baseline, path))
    except InputError as exc:
        said = str(exc)
        raise InputError(said if said.startswith(f"{path}:") else f"{path}: {said}") from None
    _same_unit(base, baseline, path)
    combos = [dict(zip(space.vary, c, strict=True)) for c in itertools.product(*space.vary.values())]
    names = [_name(base.name, params, False) for params in combos]
    hashed = len(set(names)) < len(names)  # `a b` and `a_b` read alike in a name: each gets its key's hash

    def one(params: dict[str, Value]) -> Point:
        point = _point(base_data, base.name, space.extends, params, path, hashed=hashed)
        if on_point is not None:
            on_point(len(combos))
        return point

    # Each point's unit is read by systemd-analyze, a process of its own: several at once.
    with ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 1) + 2)) as pool:
        points = list(pool.map(one, combos))
    points = _once(points)
    if not any(p.profile is not None for p in points):
        reasons = "; ".join(f"{p.label}: {p.pruned}" for p in points[:3])
        raise InputError(f"{path}: every point of vary is refused by the profile rules ({reasons}): fix vary")
    return Expanded(space, path, digest, base, baseline, points, traffic(space, path))


def _field(prof: profile_mod.Profile, dotted: str) -> Any:
    value: Any = prof
    for part in dotted.split("."):
        value = getattr(value, part)
    return value.model_dump() if isinstance(value, BaseModel) else value


def _once(points: list[Point]) -> list[Point]:
    """Points whose units are the same are one setting: `0.5`, `0.50` and `5e-1` all render
    `--mem-fraction-static 0.5`. The first is measured; the others are pruned, naming it."""
    first: dict[tuple[str, str], Point] = {}
    out = []
    for p in points:
        if p.profile is not None:
            plan = launch.build(p.profile)
            # the unit but the trial's name (its comment and Description=), and the files beside it
            setting = (plan.unit.replace(p.name, "<trial>"), str(plan.adaptive_config or ""))
            if setting in first:
                p = Point(p.params, p.name, pruned=f"the same unit as {first[setting].label}: one setting")
            else:
                first[setting] = p
        out.append(p)
    return out


def _same_unit(base: profile_mod.Profile, baseline: profile_mod.Profile, path: Path) -> None:
    """The baseline takes the trials' unit on each host (one unit, one lock), and is one host."""
    if baseline.service.unit_name != base.service.unit_name:
        raise InputError(
            f"{path}: baseline {baseline.name}'s service.unit_name {baseline.service.unit_name} is not "
            f"{base.name}'s {base.service.unit_name}: the baseline and the trials must be the same unit"
        )
    secrets = ("api_key", "secret_env", "service.environment_files")
    for name in secrets:
        mine, theirs = _field(baseline, name), _field(base, name)
        if mine != theirs:  # one play carries one set of secrets, and hosts share plays
            raise InputError(
                f"{path}: baseline {baseline.name}'s {name} is not {base.name}'s: the baseline and the "
                "trials share their plays, and a play carries one set of secrets; give them the same"
            )
    for prof in (base, baseline):
        if prof.deployment.kind == "multinode":
            raise InputError(
                f"{path}: {prof.name} is a multi-node deployment: a tune trial is one host; "
                "extend a single-host profile"
            )


def _point(
    base_data: dict[str, Any],
    base_name: str,
    extends: str,
    params: dict[str, Value],
    path: Path,
    hashed: bool = False,
) -> Point:
    data = _copy(base_data)
    for field, value in params.items():
        _set(data, field, value)
    name = _name(base_name, params, hashed)
    data |= {"name": name, "extends": extends, "description": f"tune trial: {label(params)}"}
    source = f"{path.name} {label(params)}"
    try:
        prof = profile_mod.validate(data, source=source)
        systemd_check.require(prof, [launch.build(prof)])
    except ProfileError as exc:
        reasons = "; ".join(f"{p.loc}: {p.message}" if p.loc else p.message for p in exc.problems)
        return Point(params, name, pruned=reasons)
    return Point(params, name, prof)


def derived(x: Expanded, params: dict[str, Any]) -> Point:
    """A profile the campaign makes beyond the grid (SGLang's adaptive mode with tiers of its own
    winners): the space's profile with `params` set, through every rule as a point is."""
    base_data, _ = profile_mod.load_raw(_ref(x.space.extends, x.path))
    return _point(base_data, x.base.name, x.space.extends, params, x.path, hashed=True)


def traffic(space: Space, path: Path) -> bench_mod.Traffic:
    """The space's traffic as bench's (the dataset read here, relative to the space file)."""
    from orchestrator.tuning import datasets

    t = space.traffic
    dataset = None
    if t.dataset:
        file = Path(t.dataset) if Path(t.dataset).is_absolute() else path.parent / t.dataset
        try:
            dataset = datasets.load(file)
        except InputError as exc:
            raise InputError(f"{path}: traffic.dataset: {exc}") from None
    levels = tuple(t.concurrency)
    base = bench_mod.Settings(
        requests=t.requests,
        concurrency=0 if t.request_rate and "concurrency" not in t.model_fields_set else levels[0],
        max_tokens=t.max_tokens,
        warmup=t.warmup,
        endpoint=t.endpoint,
        dataset=dataset,
        temperature=t.temperature,
        seed=t.seed,
    )
    return bench_mod.Traffic(base, levels, tuple(t.request_rate or ()), t.repeat)
