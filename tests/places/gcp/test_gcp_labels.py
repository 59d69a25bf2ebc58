"""The one encoding of gpufinops's tags as GCE labels (places/gcp/labels.py): what GCE accepts, read back equal."""

from __future__ import annotations

import re

import pytest

from gpufinops.model import TAG_MARKED, TAG_PROTECT, TAG_SNOOZE, TAG_STOPPED_REASON
from gpufinops.places.gcp.labels import (LabelError, decode_key, encode_key, encode_value, in_label_words,
                                         labels_to_tags, tags_to_labels)

GCE_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")  # cloud.google.com/compute/docs/labeling-resources
GCE_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")


def test_our_tags_become_valid_labels_and_read_back_exactly():
    tags = {TAG_MARKED: "2026-12-07T10:15:00Z", TAG_SNOOZE: "2026-12-09T09:00:00Z", TAG_PROTECT: "true",
            "gpufinops:allow-stop": "true", "team": "ml"}
    labels = tags_to_labels(tags)
    assert labels == {"gpufinops_marked-for-stop": "20261207t101500z", "gpufinops_snooze-until": "20261209t090000z",
                      "gpufinops_protect": "true", "gpufinops_allow-stop": "true", "team": "ml"}
    assert all(GCE_KEY.match(k) and GCE_VALUE.match(v) for k, v in labels.items())
    assert labels_to_tags(labels) == tags


def test_a_time_written_by_hand_without_seconds_reads_as_a_time():
    assert labels_to_tags({"gpufinops_snooze-until": "20261208t0900z"}) == {TAG_SNOOZE: "2026-12-08T09:00:00Z"}


def test_a_value_that_is_no_time_comes_back_as_it_is():
    # A person's unreadable snooze stays unreadable: the act stage reads it as the longest snooze, never as none.
    assert labels_to_tags({"gpufinops_snooze-until": "tomorrow"}) == {TAG_SNOOZE: "tomorrow"}


def test_free_text_is_folded_into_the_label_alphabet_and_cut_to_63():
    value = encode_value(TAG_STOPPED_REASON, "gpu-util-below-40pct-10m: GPU util 0.4% over 10 min, ≤ 40% — idle " * 3)
    assert GCE_VALUE.match(value) and len(value) == 63
    assert value.startswith("gpu-util-below-40pct-10m--gpu-util-0-4--over-10-min")


@pytest.mark.parametrize("key", ["Stop-OK", "9lives", "team:ml", "x" * 64, ""])
def test_a_key_that_cannot_be_a_label_is_refused_by_name(key):
    with pytest.raises(LabelError, match="cannot be a GCE label key"):
        encode_key(key)


def test_keys_of_people_pass_unchanged():
    assert encode_key("owner") == "owner" and decode_key("goog-gke-node") == "goog-gke-node"


def test_a_reason_in_tags_is_said_in_labels():
    assert in_label_words("snoozed until 10:00 UTC by tag gpufinops:snooze-until; tag team kept") == \
        "snoozed until 10:00 UTC by label gpufinops_snooze-until; tag team kept"
