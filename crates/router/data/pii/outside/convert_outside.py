#!/usr/bin/env python3
"""Convert public, openly licensed NER corpora into Straddle's span-JSONL format.

Python 3 standard library only; deterministic (fixed seed, no dict-order or
locale dependence). Reads the original corpus files exactly as they are found in
the upstream repository snapshots (see PROVENANCE.md for the commits and the
commands that extract them) and writes:

  <out>/wikigold.jsonl          test corpus 1   (Wikigold, CC-BY-4.0)
  <out>/wnut17_test.jsonl       test corpus 2   (WNUT-17 test split, CC-BY-4.0)
  <out>/train_frames.jsonl      training frames (Broad Twitter Corpus, CC-BY-4.0)

plus, for each, a line-aligned sidecar `<name>.meta.jsonl` that records the
source location of every text, the corpus's own label for every kept span, and
every span that was dropped (with its original label and reason), so that an
evaluator can ignore predictions that fall on deliberately dropped material.

Output line format (one JSON object per line):
  {"full_text": "...", "spans": [{"entity_type": "PERSON",
                                   "start_position": 14, "end_position": 29}]}
Offsets are Unicode code points (Python str indices), end exclusive.

Usage (the exact command is recorded in PROVENANCE.md):
  python3 convert_outside.py \
      --wikigold   wikigold.conll.txt \
      --wnut17-test emerging.test.annotated \
      --btc a.conll b.conll e.conll f.conll g.conll h.conll \
      --out-dir OUT
"""

import argparse
import hashlib
import json
import os
import random
import sys
import unicodedata

# ---------------------------------------------------------------------------
# Expected inputs (sha256 of the files as found in the upstream snapshots).
# ---------------------------------------------------------------------------
EXPECTED_SHA256 = {
    "wikigold.conll.txt":
        "c797a64d0cf73ed058363f77671486bcfd413e70fda1726ad4a6ba624455225f",
    "emerging.test.annotated":
        "2aa79b764e56ec9264a1b30fdd9b70195bd00ff400b62edd8f399d5f13c178f0",
    "a.conll": "ac824cc13c88283fe3cca05343e46c79ec4cd5b174429f27bf8fe0ebdc1bbf33",
    "b.conll": "504a094a0398e03fd7b394510e313b8fc844407102252182d90aea23f53cc322",
    "e.conll": "77aca745cdc28ae0fafbcf36a93ccfd15357a8db97c21d91083592dd85e348c5",
    "f.conll": "3bd2387dfc98ebc9d8b77d8b9c59826262e9beadce71ce8edde272821b9c87c8",
    "g.conll": "d53a27645cabc4e63313d573498b48b0cc5ed780d280edfbdc4fedefe23479da",
    "h.conll": "7f31215a79f3131526236203907c8d003b8e0f8ee6eef2a216ebb685340ebe39",
}

WIKIGOLD_SAMPLE_SIZE = 1500
WIKIGOLD_SEED = 17

# Label mappings: corpus label -> Straddle entity type (None = dropped).
WIKIGOLD_MAP = {"PER": "PERSON", "LOC": "LOCATION", "ORG": "ORGANIZATION",
                "MISC": None}
WNUT17_MAP = {"person": "PERSON", "location": "LOCATION",
              "corporation": "ORGANIZATION", "group": "ORGANIZATION",
              "product": None, "creative-work": None}
BTC_MAP = {"PER": "PERSON", "LOC": "LOCATION", "ORG": "ORGANIZATION"}

# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------


def read_text(path):
    # Read bytes and split on '\n' only: no universal-newline translation and
    # no str.splitlines() (which would also split on U+2028, U+0085, ...).
    with open(path, "rb") as fh:
        data = fh.read()
    return data, data.decode("utf-8")


def sha256_bytes(data):
    return hashlib.sha256(data).hexdigest()


def verify(name, data, allow_other):
    got = sha256_bytes(data)
    want = EXPECTED_SHA256.get(name)
    if got != want:
        msg = "%s: sha256 %s, expected %s" % (name, got, want)
        if not allow_other:
            sys.exit(msg + " (use --allow-other-inputs to convert anyway)")
        print("warning: " + msg, file=sys.stderr)


def parse_conll(text, sep, source):
    """Yield sentences as lists of (token, label, line_no).

    `sep` is the token/label separator ('\t' or ' ').  Blank lines end a
    sentence; '-DOCSTART-' lines end a document (yielded as the marker
    'DOCSTART').  A line without the separator is a token that contained a
    line break in the original (one occurrence in BTC f.conll): it is joined
    with the following line.
    """
    lines = text.split("\n")
    sent = []
    pending = None
    for no, line in enumerate(lines, 1):
        if pending is not None:
            line = pending + "\n" + line
            pending = None
        if line == "":
            if sent:
                yield sent
                sent = []
            continue
        if line.startswith("-DOCSTART-"):
            if sent:
                yield sent
                sent = []
            yield "DOCSTART"
            continue
        if sep not in line:
            pending = line
            continue
        tok, lab = line.rsplit(sep, 1) if sep == " " else line.split(sep, 1)
        sent.append((tok, lab, no))
    if pending is not None:
        raise ValueError("%s: dangling line at end of file" % source)
    if sent:
        yield sent


# ---------------------------------------------------------------------------
# Token clean-up
# ---------------------------------------------------------------------------

HTML_ENTITIES = {"gt": ">", "lt": "<", "amp": "&", "quot": '"'}


def is_mark_only(tok):
    return tok != "" and all(unicodedata.category(c) in ("Mn", "Me", "Cf")
                             for c in tok)


def clean_tokens(sent):
    """Strip whitespace from tokens, drop empty ones, fold '& gt ;' -> '>'.

    Returns a list of (token, label, line_no).  Tokens that become empty must
    be outside any entity (asserted).
    """
    out = []
    for tok, lab, no in sent:
        t = tok.strip()
        if t == "":
            assert lab == "O", (no, tok, lab)
            continue
        out.append((t, lab, no))
    # HTML entities split by the tokenizer: '&' 'gt' ';' (all outside entities)
    res = []
    i = 0
    while i < len(out):
        if (i + 2 < len(out) and out[i][0] == "&" and out[i + 2][0] == ";"
                and out[i + 1][0] in HTML_ENTITIES
                and out[i][1] == out[i + 1][1] == out[i + 2][1] == "O"):
            res.append((HTML_ENTITIES[out[i + 1][0]], "O", out[i][2]))
            i += 3
            continue
        res.append(out[i])
        i += 1
    return res


# ---------------------------------------------------------------------------
# Detokenisation
# ---------------------------------------------------------------------------

CLOSE_PUNCT = {")", "]", "}", "%", "…", "”", "»"}
OPEN_PUNCT = {"(", "[", "{", "$", "£", "€", "#", "@", "“", "«", "¿", "¡"}
CLITICS = {"'s", "'S", "n't", "N'T", "'re", "'ve", "'ll", "'d", "'m",
           "'RE", "'VE", "'LL", "'D", "'M", "’s", "n’t", "’re", "’ve", "’ll",
           "’d", "’m"}
SPLIT_CLITIC_TAILS = {"s", "t", "ve", "re", "ll", "d", "m"}
SENT_PUNCT_CHARS = set(".,;:!?")


def is_sent_punct(tok):
    return all(c in SENT_PUNCT_CHARS for c in tok)


def is_single_letter(tok):
    return len(tok) == 1 and tok.isalpha()


def detokenise(tokens):
    """Return (text, starts) where starts[i] is the code-point offset of token i.

    Heuristic, deterministic rules (documented in PROVENANCE.md):
      * no space before , . ; : ! ? (and runs of them), ) ] } % … ” » and
        English clitics ('s n't 're 've 'll 'd 'm);
      * no space after ( [ { $ £ € # @ “ « ¿ ¡;
      * straight double quotes alternate open/close within a text;
      * split clitics  word ' s  ->  word's  (also ’);
      * split negation  does n ' t  ->  doesn't;
      * times/decimals  08 : 30  ->  08:30,  44 . 44  ->  44.44;
      * markdown links  ] (  ->  ](;
      * emoticons  : )  ->  :)  (space before; only if ')' closes no '(');
      * acronyms split at dots  B . C .  ->  B.C.;
      * reddit names  / r / foo  ->  /r/foo;
      * '_' glues to both neighbours (WNUT splits user names at '_');
      * tokens made only of combining marks / format characters (e.g. the
        emoji variation selector U+FE0F) glue to the previous token.
    """
    n = len(tokens)
    glue = [False] * n  # glue[i]: no space between tokens[i-1] and tokens[i]
    quote_open = False
    for i, t in enumerate(tokens):
        if i == 0:
            continue
        prev = tokens[i - 1]
        if is_sent_punct(t) or t in CLOSE_PUNCT or t in CLITICS:
            glue[i] = True
        if prev in OPEN_PUNCT:
            glue[i] = True
        if is_mark_only(t):
            glue[i] = True
        if t == "_" or prev == "_":
            glue[i] = True
    # straight double quotes
    for i, t in enumerate(tokens):
        if t == '"':
            if not quote_open:
                if i + 1 < n:
                    glue[i + 1] = True
            else:
                if i > 0:
                    glue[i] = True
            quote_open = not quote_open
    # split clitics:  word ' s
    for i in range(1, n - 1):
        if (tokens[i] in ("'", "’") and tokens[i + 1] in SPLIT_CLITIC_TAILS
                and tokens[i - 1][-1:].isalnum()):
            glue[i] = True
            glue[i + 1] = True
    # split negation:  does n ' t  ->  doesn't
    for i in range(2, n - 1):
        if (tokens[i] in ("'", "’") and tokens[i - 1] in ("n", "N")
                and tokens[i + 1] in ("t", "T") and tokens[i - 2].isalpha()):
            glue[i - 1] = True
    # times and decimals split by the tokenizer:  08 : 30 , 44 . 44
    for i in range(1, n - 1):
        if (tokens[i] in (":", ".") and tokens[i - 1].isdigit()
                and tokens[i + 1][:1].isdigit()):
            glue[i] = glue[i + 1] = True
    # markdown links:  [text] (url)
    for i in range(1, n):
        if tokens[i] == "(" and tokens[i - 1] == "]":
            glue[i] = True
    # emoticons  : )  ; )  ->  :)  ;)  with a space before the emoticon,
    # when the ')' does not close an open '('
    depth = 0
    for i in range(n):
        if tokens[i] == "(":
            depth += 1
        elif tokens[i] == ")":
            if depth > 0:
                depth -= 1
            elif i > 0 and tokens[i - 1] in (":", ";"):
                glue[i] = True
                glue[i - 1] = False
    # acronyms:  B . C .
    for i in range(1, n - 2):
        if (tokens[i] == "." and is_single_letter(tokens[i - 1])
                and is_single_letter(tokens[i + 1]) and tokens[i + 2] == "."):
            glue[i + 1] = True
    # reddit:  / r / name
    for i in range(0, n - 3):
        if (tokens[i] == "/" and tokens[i + 1] in ("r", "u")
                and tokens[i + 2] == "/"):
            glue[i + 1] = glue[i + 2] = glue[i + 3] = True
    parts = []
    starts = []
    pos = 0
    for i, t in enumerate(tokens):
        if i > 0 and not glue[i]:
            parts.append(" ")
            pos += 1
        starts.append(pos)
        parts.append(t)
        pos += len(t)
    text = "".join(parts)
    for i, t in enumerate(tokens):
        assert text[starts[i]:starts[i] + len(t)] == t
    return text, starts


# ---------------------------------------------------------------------------
# Span extraction
# ---------------------------------------------------------------------------


def label_spans(labels):
    """Entity spans of BIO labels (BTC, WNUT-17), read the same way for IO labels
    (Wikigold): a B-X, or an I-X that does not continue an X entity, starts one."""
    spans = []
    cur = None
    for i, lab in enumerate(labels):
        if lab == "O":
            cur = None
            continue
        if lab[:2] not in ("B-", "I-"):
            raise ValueError("bad label %r" % lab)
        typ = lab[2:]
        if lab.startswith("B-") or cur is None or cur[0] != typ:
            cur = [typ, i, i + 1]
            spans.append(cur)
        else:
            cur[2] = i + 1
    return [tuple(s) for s in spans]


def merge_handle_prefix(spans, tokens, starts, text):
    """BTC tags '@' and the user name as two B- entities ('@' B-PER, 'x' B-PER).

    When a span is exactly a lone '@' or '#' token that is glued to an
    immediately following span of the same type, merge the two.
    """
    out = []
    i = 0
    while i < len(spans):
        typ, s, e = spans[i]
        if (e - s == 1 and tokens[s] in ("@", "#") and i + 1 < len(spans)
                and spans[i + 1][0] == typ and spans[i + 1][1] == e
                and starts[e] == starts[s] + 1):
            out.append((typ, s, spans[i + 1][2]))
            i += 2
            continue
        out.append((typ, s, e))
        i += 1
    return out


def build_record(tokens, labels, label_map, source_meta):
    text, starts = detokenise(tokens)
    raw = label_spans(labels)
    raw = merge_handle_prefix(raw, tokens, starts, text)
    kept, kept_meta, dropped = [], [], []
    for typ, s, e in raw:
        start = starts[s]
        end = starts[e - 1] + len(tokens[e - 1])
        surface = text[start:end]
        # The span text must be exactly the entity's tokens, joined.
        assert surface.replace(" ", "") == "".join(tokens[s:e]).replace(" ", ""), \
            (surface, tokens[s:e])
        assert surface == surface.strip() and surface != ""
        in_handle = surface[0] in "@#" or (start > 0 and text[start - 1] in "@#")
        mapped = label_map.get(typ, "__unknown__")
        if mapped == "__unknown__":
            raise ValueError("unmapped label %r in %r" % (typ, source_meta))
        if mapped is None:
            dropped.append({"label": typ, "start": start, "end": end,
                            "text": surface, "reason": "no counterpart"})
        elif surface.startswith(("/r/", "/u/", "r/", "u/")):
            dropped.append({"label": typ, "start": start, "end": end,
                            "text": surface,
                            "reason": "reddit community / user name"})
        elif in_handle:
            dropped.append({"label": typ, "start": start, "end": end,
                            "text": surface,
                            "reason": "user handle / hashtag"})
        else:
            kept.append({"entity_type": mapped, "start_position": start,
                         "end_position": end})
            kept_meta.append({"label": typ, "start": start, "end": end,
                              "text": surface})
    # no overlaps
    for a, b in zip(kept, kept[1:]):
        assert a["end_position"] <= b["start_position"]
    # Dropped material stays in the file, under a label no detector class maps to, so an
    # evaluator neither scores it nor counts a prediction on it as a false alarm.
    unscored = [{"entity_type": "UNSCORED_" + d["label"].upper().replace("-", "_"),
                 "start_position": d["start"], "end_position": d["end"]} for d in dropped]
    rec = {"full_text": text,
           "spans": sorted(kept + unscored, key=lambda x: x["start_position"])}
    meta = dict(source_meta)
    meta["kept"] = kept_meta
    meta["dropped"] = dropped
    return rec, meta


# ---------------------------------------------------------------------------
# Corpora
# ---------------------------------------------------------------------------


def convert_wikigold(path):
    data, text = read_text(path)
    records = []
    doc = -1
    sent_in_doc = 0
    for sent in parse_conll(text, " ", path):
        if sent == "DOCSTART":
            doc += 1
            sent_in_doc = 0
            continue
        sent = clean_tokens(sent)
        toks = [t for t, _, _ in sent]
        labs = [l for _, l, _ in sent]
        meta = {"corpus": "wikigold", "file": "wikigold.conll.txt",
                "first_line": sent[0][2], "doc": doc,
                "sentence_in_doc": sent_in_doc}
        records.append(build_record(toks, labs, WIKIGOLD_MAP, meta))
        sent_in_doc += 1
    total = len(records)
    rng = random.Random(WIKIGOLD_SEED)
    keep = sorted(rng.sample(range(total), min(WIKIGOLD_SAMPLE_SIZE, total)))
    return data, [records[i] for i in keep], total


def convert_wnut17_test(path):
    data, text = read_text(path)
    records = []
    for k, sent in enumerate(parse_conll(text, "\t", path)):
        assert sent != "DOCSTART"
        sent = clean_tokens(sent)
        toks = [t for t, _, _ in sent]
        labs = [l for _, l, _ in sent]
        meta = {"corpus": "wnut17-test", "file": "emerging.test.annotated",
                "first_line": sent[0][2], "doc": k}
        records.append(build_record(toks, labs, WNUT17_MAP, meta))
    return data, records, len(records)


def convert_btc(paths):
    datas = []
    records = []
    # canonical order: sections a, b, e, f, g, h whatever the argument order
    for path in sorted(paths, key=os.path.basename):
        data, text = read_text(path)
        datas.append((os.path.basename(path), data))
        section = os.path.basename(path).split(".")[0]
        for k, sent in enumerate(parse_conll(text, "\t", path)):
            assert sent != "DOCSTART"
            sent = clean_tokens(sent)
            if not sent:
                continue
            toks = [t for t, _, _ in sent]
            labs = [l for _, l, _ in sent]
            meta = {"corpus": "btc", "file": os.path.basename(path),
                    "section": section.upper(), "first_line": sent[0][2],
                    "doc": k}
            records.append(build_record(toks, labs, BTC_MAP, meta))
    return datas, records


def norm_key(text):
    return "".join(c for c in text.lower() if c.isalnum())


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wikigold", required=True)
    ap.add_argument("--wnut17-test", required=True)
    ap.add_argument("--btc", required=True, nargs="+")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--allow-other-inputs", action="store_true",
                    help="convert even if an input's sha256 differs from "
                         "the snapshot recorded in PROVENANCE.md")
    args = ap.parse_args()

    wg_data, wikigold, wg_total = convert_wikigold(args.wikigold)
    wn_data, wnut, _ = convert_wnut17_test(args.wnut17_test)
    btc_datas, btc = convert_btc(args.btc)

    # Keep test and training apart: drop any training text that also occurs
    # (after lower-casing and removing non-alphanumerics) in a test file.
    test_keys = {norm_key(r["full_text"]) for r, _ in wikigold + wnut}
    train, overlap = [], 0
    for r, m in btc:
        if norm_key(r["full_text"]) in test_keys:
            overlap += 1
            continue
        train.append((r, m))

    verify("wikigold.conll.txt", wg_data, args.allow_other_inputs)
    verify("emerging.test.annotated", wn_data, args.allow_other_inputs)
    if sorted(n for n, _ in btc_datas) != ["a.conll", "b.conll", "e.conll",
                                            "f.conll", "g.conll", "h.conll"]:
        sys.exit("--btc expects the six section files a b e f g h .conll")
    for name, d in btc_datas:
        verify(name, d, args.allow_other_inputs)

    os.makedirs(args.out_dir, exist_ok=True)
    for name, rows in (("wikigold", wikigold), ("wnut17_test", wnut),
                       ("train_frames", train)):
        write_jsonl(os.path.join(args.out_dir, name + ".jsonl"),
                    [r for r, _ in rows])
        write_jsonl(os.path.join(args.out_dir, name + ".meta.jsonl"),
                    [m for _, m in rows])
    print("wikigold: %d of %d sentences (seed %d)" %
          (len(wikigold), wg_total, WIKIGOLD_SEED))
    print("wnut17_test: %d texts" % len(wnut))
    print("train_frames: %d texts (%d dropped as overlapping a test text)" %
          (len(train), overlap))


if __name__ == "__main__":
    main()
