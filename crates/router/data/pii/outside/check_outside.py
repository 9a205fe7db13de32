#!/usr/bin/env python3
"""Validate the converted files (python3 stdlib only).

  python3 check_outside.py wikigold wnut17_test train_frames

For each NAME checks NAME.jsonl and the line-aligned NAME.meta.jsonl: keys,
offsets in range, spans sorted and non-overlapping, no span cuts a word or
starts/ends with whitespace, span text equals the recorded source text, and
prints counts per entity type, texts without spans and dropped spans.
"""
import collections
import json
import sys

TYPES = {"PERSON", "LOCATION", "ORGANIZATION", "STREET_ADDRESS",
         "PHONE_NUMBER", "EMAIL_ADDRESS", "CREDIT_CARD", "IBAN_CODE",
         "US_SSN", "IP_ADDRESS", "US_DRIVER_LICENSE", "US_PASSPORT",
         "DATE_TIME", "NRP"}


def check(name):
    rows = [json.loads(l) for l in open(name + ".jsonl", encoding="utf-8")]
    metas = [json.loads(l) for l in open(name + ".meta.jsonl", encoding="utf-8")]
    assert len(rows) == len(metas), name
    types = collections.Counter()
    dropped = collections.Counter()
    empty = 0
    for ln, (r, m) in enumerate(zip(rows, metas), 1):
        assert list(r) == ["full_text", "spans"], (name, ln)
        t = r["full_text"]
        assert t and t == t.strip() and "\n" not in t, (name, ln)
        scored = [s for s in r["spans"] if not s["entity_type"].startswith("UNSCORED_")]
        unscored = [s for s in r["spans"] if s["entity_type"].startswith("UNSCORED_")]
        assert len(scored) == len(m["kept"]), (name, ln)
        assert len(unscored) == len(m["dropped"]), (name, ln)
        prev = 0
        for s, k in zip(scored, m["kept"]):
            assert list(s) == ["entity_type", "start_position", "end_position"]
            a, b = s["start_position"], s["end_position"]
            assert s["entity_type"] in TYPES, (name, ln, s)
            assert prev <= a < b <= len(t), (name, ln, s)
            seg = t[a:b]
            assert seg == seg.strip() == k["text"], (name, ln, seg, k)
            assert (k["start"], k["end"]) == (a, b)
            assert a == 0 or not (t[a - 1].isalnum() and t[a].isalnum()), (name, ln, seg)
            assert b == len(t) or not (t[b - 1].isalnum() and t[b].isalnum()), (name, ln, seg)
            prev = b
            types[s["entity_type"]] += 1
        for d in m["dropped"]:
            assert t[d["start"]:d["end"]] == d["text"], (name, ln, d)
            dropped[(d["label"], d["reason"])] += 1
        empty += not scored
    print("%s: %d texts, %d without spans, spans %s" %
          (name, len(rows), empty, dict(sorted(types.items()))))
    print("   dropped %s" % dict(sorted(dropped.items())))


if __name__ == "__main__":
    for n in sys.argv[1:] or ["wikigold", "wnut17_test", "train_frames"]:
        check(n)
