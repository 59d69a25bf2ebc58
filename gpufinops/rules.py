"""Load and validate idle-shutdown rules (rules/*.yaml) into `Rule` values.

A rule file holds `rules: [ ... ]`. Every error names the file, the line and the
dotted key, e.g. `rules/idle.yaml:12: key 'rules.0.window': expected a
duration like 10m, 1h30m or 600`.
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Iterable, Literal

from pydantic import AfterValidator, Field, ValidationError, field_validator, model_validator

from .config import (DEFAULT_RULES_DIR, ConfigError, StrictModel, defaults_of, destination, format_validation_error,
                     line_of, not_a_regular_file, parse_yaml_tree, printable, read_text, slack_channel)
from .rule_types import IDLE_MEMORY_FLOOR_MIB, Action, Aggregation, NoCounterPolicy, Rule, Selector
from .places.registry import rule_caveats, rule_subjects

if TYPE_CHECKING:
    import yaml

log = logging.getLogger("gpufinops.rules")
# (file, rule name) whose deprecated `slack_channel` was already warned of: the service re-reads its rules every tick,
# and one warning per process says it (a log line every tick would bury the rest).
_DEPRECATION_SAID: set[tuple[str, ...]] = set()

_DURATION = re.compile(r"^\s*(?:(\d+)\s*d)?\s*(?:(\d+)\s*h)?\s*(?:(\d+)\s*m)?\s*(?:(\d+)\s*s)?\s*$")


# No duration anywhere in gpufinops is longer than this (a --since, a history, a rule window):
# a bigger one is a typo or a unit mix-up (milliseconds), and would overflow datetime arithmetic.
MAX_DURATION_S = 10 * 366 * 86400
# A rule's idle window and warning lead: a week at most. The lead is at least a minute: a stop
# needs a warning a person can read and answer (the tests and shipped rules use 15m and 30m).
MAX_WINDOW_S = 7 * 86400
MIN_WARNING_LEAD_S = 60
MAX_WARNING_LEAD_S = 7 * 86400
LEARNED_REMOVED = ("the learned idle policy was removed (held out it scored below a tuned fixed rule, see "
                   "BENCHMARKS.md): delete the 'learned:' block; the rule's own window decides")


def duration_spec(seconds: int) -> str:
    """A duration spelled as a rule file writes it ('7d', '2h', '10m', '45s'): what parse_duration reads back
    (config errors and exported rules say it so; people read model.format_duration)."""
    if seconds % 86400 == 0:
        return f"{seconds // 86400}d"
    if seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    if seconds % 60 == 0:
        return f"{seconds // 60}m"
    return f"{seconds}s"


def _number_text(value: int | float) -> str:
    """A number for a message; huge integers are not converted to float (OverflowError) or spelled out."""
    if isinstance(value, int):
        return str(value) if abs(value) < 10**18 else ("-" if value < 0 else "") + "1e18 or more"
    return f"{value:g}"


def parse_duration(value: Any, min_s: int = 1, max_s: int = MAX_DURATION_S) -> int:
    """'10m' -> 600, '1h30m' -> 5400, 600 -> 600, within [min_s, max_s] seconds. Raises ValueError.

    Refused: booleans, inf, nan, negatives, zero, and anything longer than max_s."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"expected a duration like 10m, 1h30m or 600 (seconds), got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"duration must be a finite number of seconds, got {value!r}")
    given = None  # a duration written as text is quoted as written ("5000d"), never as its seconds
    if isinstance(value, str):
        given = value.strip()
        m = _DURATION.match(value)
        if not (m and any(m.groups())):
            raise ValueError(f"expected a duration like 10m, 1h30m or 600 (seconds), got {value!r}")
        d, h, mi, s = (int(x) if x else 0 for x in m.groups())
        value = d * 86400 + h * 3600 + mi * 60 + s
    if value <= 0:
        raise ValueError(f"duration must be positive, got {_number_text(value)}")
    given = given or f"{_number_text(value)} s"
    if value > max_s:
        raise ValueError(f"duration {given} is longer than the maximum {duration_spec(max_s)}")
    seconds = int(value)
    if seconds < min_s:
        raise ValueError(f"duration {given} is shorter than the minimum {min_s} s")
    return seconds



def _as_values(v: Any) -> tuple[str, ...]:
    if isinstance(v, (list, tuple)):
        return tuple(str(x) for x in v)
    return (str(v),)


class _SelectorModel(StrictModel):
    tags: dict[str, str | list[str]] = Field(default_factory=dict)
    exclude_tags: dict[str, str | list[str]] = Field(default_factory=dict)
    instance_families: list[str] = Field(default_factory=list)
    instance_types: list[str] = Field(default_factory=list)
    accounts: list[str] = Field(default_factory=list)
    regions: list[str] = Field(default_factory=list)

    def to_selector(self) -> Selector:
        return Selector(
            tags={k: _as_values(v) for k, v in self.tags.items()},
            exclude_tags={k: _as_values(v) for k, v in self.exclude_tags.items()},
            instance_families=tuple(self.instance_families),
            instance_types=tuple(self.instance_types),
            accounts=tuple(str(a) for a in self.accounts),
            regions=tuple(self.regions),
        )


class _RuleModel(StrictModel):
    name: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.:-]+$")
    description: str = ""
    select: _SelectorModel = Field(default_factory=defaults_of(_SelectorModel))  # no validator built for a default
    metric: Literal["gpu_activity"] = "gpu_activity"
    threshold_pct: float = Field(gt=0, le=100)
    window: int
    aggregation: Aggregation = Aggregation.STAYS_BELOW
    min_coverage: float = Field(0.8, gt=0, le=1)
    warning_lead: int = 900
    action: Action = Action.NOTIFY
    # Terminating destroys the instance and its local disks: the rule must say so twice.
    confirm_terminate: bool = False
    # Where the rule's notices go, each destination with its transport ('slack:#ml-gpus', 'email:a@example.com')
    # or an audience ('owner', 'team', 'default'); notify/routing.py sends them. Empty: the team's channel.
    notify_to: list[Annotated[str, AfterValidator(destination)]] | None = None
    # Deprecated alias of `notify_to: [slack:<channel>]` (a warning at load names the file and key).
    slack_channel: str | None = None
    underutilized_below_pct: float = Field(60.0, ge=0, le=100)
    max_memory_mib: float | None = Field(None, ge=0, le=16 * 2**20)  # 16 TiB: more than any GPU holds
    # GPUs without an activity counter (MIG instances read by gpufinops agent): "never" idle (UNKNOWN unless
    # processes or memory show work), or "no_processes_and_idle_memory" (docs/metrics.md, "Evidence of work").
    idle_without_activity_counter: NoCounterPolicy = NoCounterPolicy.NEVER
    idle_memory_floor_mib: float = Field(IDLE_MEMORY_FLOOR_MIB, ge=0, le=16 * 2**20)
    # The learned idle policy was removed; a rule file that still has the block gets an error saying so.
    learned: Any = None

    @field_validator("learned")
    @classmethod
    def _learned_removed(cls, v: Any) -> None:
        if v is not None:
            raise ValueError(LEARNED_REMOVED)
        return None

    @field_validator("window", mode="before")
    @classmethod
    def _window(cls, v: Any) -> int:
        return parse_duration(v, max_s=MAX_WINDOW_S)

    @field_validator("warning_lead", mode="before")
    @classmethod
    def _warning_lead(cls, v: Any) -> int:
        return parse_duration(v, min_s=MIN_WARNING_LEAD_S, max_s=MAX_WARNING_LEAD_S)

    @field_validator("slack_channel")
    @classmethod
    def _old_channel(cls, v: str | None) -> str | None:
        return v and slack_channel(v)  # "" (as before): no channel named

    @model_validator(mode="after")
    def _one_way_to_say_where(self) -> "_RuleModel":
        if self.slack_channel is not None and self.notify_to is not None:
            raise ValueError("'slack_channel' and 'notify_to' both given: 'slack_channel' is the deprecated spelling "
                             f"of notify_to: [slack:{self.slack_channel}]; keep notify_to only")
        return self

    def destinations(self) -> tuple[str, ...]:
        """notify_to in order, each once (the deprecated `slack_channel: X` is notify_to: [slack:X])."""
        if self.slack_channel:
            return (f"slack:{self.slack_channel}",)
        return tuple(dict.fromkeys(self.notify_to or ()))

    @model_validator(mode="after")
    def _terminate_needs_confirmation(self) -> "_RuleModel":
        if self.action == Action.TERMINATE and not self.confirm_terminate:
            raise ValueError("action 'terminate' also needs 'confirm_terminate: true' (terminate destroys the instance)")
        return self

    @model_validator(mode="after")
    def _action_selects_its_subjects(self) -> "_RuleModel":
        # Suspending (a Kueue job's Workload deactivated) and draining (a GPU node cordoned) apply to one kind of
        # subject each: a rule that does not say it selects them would warn everything else it matches "notify
        # only". Neither deletes anything, so confirm_terminate has no place on them.
        subjects = rule_subjects(self.action)  # the one place that takes the action says what selects it
        if subjects is None:
            return self
        selectors, needs = subjects
        if not set(self.select.tags) & set(selectors):
            raise ValueError(needs)
        if self.confirm_terminate:
            raise ValueError(f"'confirm_terminate' is for action 'terminate'; action '{self.action.value}' never "
                             f"deletes anything")
        return self


class _RuleFile(StrictModel):
    rules: list[_RuleModel]


def _rule_line(root: yaml.Node | None, index: int) -> int | None:
    """The line where rule `index` of a rule file begins (`root`: the file's compose_yaml())."""
    import yaml

    try:
        for k, v in root.value:
            if k.value == "rules" and isinstance(v, yaml.SequenceNode) and index < len(v.value):
                return v.value[index].start_mark.line + 1
    except Exception:  # only for a nicer message; validation already passed
        return None
    return None


def load_rule_file(path: str | Path) -> list[Rule]:
    text = read_text(Path(path))
    raw, root = parse_yaml_tree(Path(path), text)  # the rules and, from the same reading, their lines
    if raw is None:
        raise ConfigError(f"{path}: empty rule file (expected 'rules: [...]')")
    try:
        parsed = _RuleFile.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(str(path), text, exc)) from None
    out = []
    for i, r in enumerate(parsed.rules):
        line = _rule_line(root, i)
        if r.slack_channel is not None and (str(path), r.name) not in _DEPRECATION_SAID:
            _DEPRECATION_SAID.add((str(path), r.name))
            at = (line_of(str(path), ("rules", i, "slack_channel"), text, root) if root is not None else None) or line
            log.warning("%s: key 'rules.%d.slack_channel' is deprecated: write notify_to: [%s] instead",
                        f"{path}:{at}" if at else path, i,
                        r.destinations()[0] if r.slack_channel else "")
        out.append(
            Rule(
                name=r.name,
                description=r.description,
                selector=r.select.to_selector(),
                threshold_pct=r.threshold_pct,
                window_s=r.window,
                aggregation=r.aggregation,
                min_coverage=r.min_coverage,
                warning_lead_s=r.warning_lead,
                action=r.action,
                notify_to=r.destinations(),
                underutilized_below_pct=r.underutilized_below_pct,
                max_memory_mib=r.max_memory_mib,
                idle_without_activity_counter=r.idle_without_activity_counter,
                idle_memory_floor_mib=r.idle_memory_floor_mib,
                source=f"{path}:{line}" if line else str(path),
            )
        )
        for caveat in rule_caveats(r.action, r.select.tags):
            if (str(path), r.name, "caveat") not in _DEPRECATION_SAID:  # once per rule and process, as the above
                _DEPRECATION_SAID.add((str(path), r.name, "caveat"))
                log.warning("%s: rule %r: %s", f"{path}:{line}" if line else path, r.name, caveat)
    return out


def rule_warnings(rule: Rule) -> tuple[str, ...]:
    """What `rules check` says of a valid rule: the limits a cloud publishes on the action it gives (GCE's on
    suspend: it refuses VMs with GPUs attached)."""
    return rule_caveats(rule.action, rule.selector.tags)


def rule_files(paths: Iterable[str | Path]) -> list[Path]:
    """Expand directories to their idle-rule YAML files (budgets.yaml is not an idle rule file)."""
    files: list[Path] = []
    for given in paths:
        if not str(given).strip():  # Path("") is ".": an empty path would read every YAML file of the folder
            raise ConfigError(f"rule path {str(given)!r} is empty: name a rule file or folder")
        p = Path(given)
        why = not_a_regular_file(p)
        if why == "a folder":
            files.extend(
                f for f in sorted(p.glob("*.y*ml")) if f.suffix in (".yaml", ".yml") and not f.stem.startswith("budget")
            )
        elif why == "does not exist":
            # A config copied out of the clone (docs/deploy.md: to /etc/gpufinops/) keeps `rules_paths: [rules]`,
            # which resolves against the config's own folder: say where the shipped rules are.
            raise ConfigError(f"{printable(str(p))}: rule path does not exist (a relative path in a config file is "
                              f"relative to that file's folder; the shipped rules are {DEFAULT_RULES_DIR}, used when "
                              f"rules_paths is not set)")
        else:  # a file, or something load_rule_file refuses naming it (a device, a name too long)
            files.append(p)
    return files


def load_rules(paths: Iterable[str | Path]) -> list[Rule]:
    """All rules from files/directories, in order. Duplicate names are an error."""
    rules: list[Rule] = []
    seen: dict[str, str] = {}
    errors: list[str] = []
    for f in rule_files(paths):
        try:
            for r in load_rule_file(f):
                if r.name in seen:
                    errors.append(f"{r.source}: key 'name': duplicate rule name {r.name!r} (first in {seen[r.name]})")
                    continue
                seen[r.name] = r.source
                rules.append(r)
        except ConfigError as exc:
            errors.append(str(exc))
    if errors:
        raise ConfigError("\n".join(errors))
    return rules
