"""gpufinops's tags as GCE labels, and back: the one encoding, so that every stage keeps reading the tags it reads
on EC2 (`gpufinops:marked-for-stop` = `2026-12-07T10:15:00Z`) while the VM carries labels GCE accepts.

GCE labels (the discovery document's `labels` map; cloud.google.com/compute/docs/labeling-resources): keys and values
of lowercase letters, digits, `_` and `-`, at most 63 characters, a key starting with a letter; at most 64 labels.
So:
- a key `gpufinops:<name>` is the label `gpufinops_<name>` (the `:` is not allowed; `_` is, and no shipped name has
  one); any other key is used as it is when it is a valid label key, else `encode_key` raises (a configured opt-in
  tag such as `Stop-OK` cannot be a label: said at start, never found out at the first stop);
- a time (the mark, the snooze) `YYYY-MM-DDTHH:MM:SSZ` is the label value `yyyymmddthhmmssz` (16 characters) and
  reads back exactly, so a read-back compares equal to the value written; a person may write the same form by hand
  (`20261208t0900z` without seconds reads too);
- any other value is lowercased, every character outside the set becomes `-`, cut to 63 (a stop's reason: text for
  people, never read back as a fact).

Label values are a person's to write: decoding never raises, and a value that is not a time comes back as it is (the
act stage then reads an unreadable snooze as the longest snooze, as on EC2).

Pure, no I/O; imports model and places.registry only.
"""

from __future__ import annotations

import re
from typing import Mapping

from ...model import TAG_MARKED, TAG_PROTECT, TAG_SNOOZE, TAG_STOP_REQUESTED
from ..registry import TAG_STOP_FENCE

MAX_LABEL_CHARS = 63
MAX_LABELS = 64
OUR_TAG_PREFIX = "gpufinops:"
OUR_LABEL_PREFIX = "gpufinops_"

LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
# The tags whose value is a time: written compact, read back as the ISO form the act stage compares.
TIME_TAGS = frozenset({TAG_MARKED, TAG_SNOOZE, TAG_STOP_REQUESTED, TAG_STOP_FENCE})
_ISO_UTC = re.compile(r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})Z$")
_COMPACT = re.compile(r"^(\d{4})(\d{2})(\d{2})t(\d{2})(\d{2})(\d{2})?z$")
_OUTSIDE = re.compile(r"[^a-z0-9_-]")


class LabelError(ValueError):
    """A tag key that cannot be a GCE label key."""


def encode_key(tag_key: str) -> str:
    """The label key of a tag key; LabelError when there is none."""
    key = OUR_LABEL_PREFIX + tag_key[len(OUR_TAG_PREFIX):] if tag_key.startswith(OUR_TAG_PREFIX) else tag_key
    if not LABEL_KEY.match(key):
        raise LabelError(f"tag {tag_key!r} cannot be a GCE label key (lowercase letters, digits, '_' and '-', "
                         f"starting with a letter, at most {MAX_LABEL_CHARS} characters)")
    return key


def decode_key(label_key: str) -> str:
    """The tag key a label key stands for."""
    if label_key.startswith(OUR_LABEL_PREFIX):
        return OUR_TAG_PREFIX + label_key[len(OUR_LABEL_PREFIX):]
    return label_key


def encode_value(tag_key: str, value: str) -> str:
    """The label value of a tag's value: a time compact, anything else folded into the label alphabet."""
    text = str(value)
    if tag_key in TIME_TAGS:
        m = _ISO_UTC.match(text.strip())
        if m:
            return "{}{}{}t{}{}{}z".format(*m.groups())
    return _OUTSIDE.sub("-", text.lower())[:MAX_LABEL_CHARS]


def decode_value(tag_key: str, value: str) -> str:
    """The tag value a label value stands for: a compact time as ISO-8601 UTC; any other value unchanged."""
    if tag_key in TIME_TAGS:
        m = _COMPACT.match(value.strip())
        if m:
            y, mo, d, h, mi, s = m.groups()
            return f"{y}-{mo}-{d}T{h}:{mi}:{s or '00'}Z"
    return value


def labels_to_tags(labels: Mapping[str, str] | None) -> dict[str, str]:
    """A VM's labels as the tags every stage reads."""
    out = {}
    for key, value in (labels or {}).items():
        tag = decode_key(str(key))
        out[tag] = decode_value(tag, str(value))
    return out


def tags_to_labels(tags: Mapping[str, str]) -> dict[str, str]:
    """Tags as labels (LabelError naming a key that cannot be one)."""
    return {encode_key(k): encode_value(k, v) for k, v in tags.items()}


def keep_hint() -> str:
    """A warning's way out on a GCE VM, in labels a person can type (notice markup): the snooze, protect, the mark."""
    snooze, protect = encode_key(TAG_SNOOZE), encode_key(TAG_PROTECT)
    return (f"To keep it running: make it busy, or label it `{snooze}` = a UTC time written `yyyymmddthhmmz` (e.g. "
            f"`20261208t0900z`: pause until then) or `{protect}` = `true` (never stop); removing its label "
            f"`{encode_key(TAG_MARKED)}` cancels what this warning announces "
            f"(`gcloud compute instances add-labels` / `remove-labels`).")


_OUR_TAG_IN_TEXT = re.compile(r"\btag (gpufinops:[a-z0-9-]+)")


def in_label_words(text: str) -> str:
    """A reason written in tags ("snoozed ... by tag gpufinops:snooze-until") as a GCE VM's owner sees it: the label
    (`label gpufinops_snooze-until`), so that a message about a VM names what is on the VM."""
    return _OUR_TAG_IN_TEXT.sub(lambda m: "label " + encode_key(m.group(1)), text)


def gcloud_add_labels(project: str, zone: str, name: str, tags: Mapping[str, str]) -> list[str]:
    """The argv of `gcloud compute instances add-labels` setting these tags as labels on one VM (LabelError for a
    key that cannot be a label); the caller quotes and shows it."""
    labels = ",".join(f"{k}={v}" for k, v in tags_to_labels(tags).items())
    return ["gcloud", "compute", "instances", "add-labels", name, f"--project={project}", f"--zone={zone}",
            f"--labels={labels}"]
