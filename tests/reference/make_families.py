"""Writes llama.cpp's outputs on the tiny random-weight models of other families.

The models are the bytes `crates/engine/tests/tiny/mod.rs::family` builds (2 layers, the
default model's vocabulary under the `qwen2` or `llama-bpe` pre-tokenizer); the test rebuilds them, so
no model file is committed. Regenerate (the venv of make_reference.py):
    cargo build --workspace --example write_tiny_families
    target/debug/examples/write_tiny_families ~/.cache/straddle/models/smollm2-135m-instruct-q4_1.gguf /tmp/families
    tests/reference/.venv/bin/python tests/reference/make_families.py /tmp/families > tests/reference/tiny-families.json

For each family and prompt: the token ids, 16 greedy tokens and the top-5 logits before each.
"""
import json
import sys

import numpy as np
from llama_cpp import Llama

PROMPTS = [
    ("en", "The quick brown fox jumps over the lazy dog."),
    ("digits", "In 2024, 12345 people said: it's 3.14!"),
    ("code", "def f(x):\n    return x*2  # double"),
]


def main(folder):
    out = {}
    for arch in ["qwen2", "qwen3", "llama3", "phi3"]:
        llm = Llama(model_path=f"{folder}/tiny-{arch}.gguf", n_ctx=256, n_threads=2, logits_all=True, verbose=False)
        cases = []
        for name, text in PROMPTS:
            llm.reset()
            toks = llm.tokenize(text.encode(), add_bos=False, special=True)
            llm.eval(toks)
            gen, steps = [], []
            for _ in range(16):
                logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
                top = np.argsort(-logits)[:5]
                steps.append([[int(i), float(logits[i])] for i in top])
                tok = int(top[0])
                gen.append(tok)
                llm.eval([tok])
            cases.append({"name": name, "prompt": text, "prompt_tokens": toks, "greedy": gen, "top5": steps})
        out[arch] = cases
    json.dump({"generator": "llama-cpp-python 0.3.36, n_threads=2", "families": out}, sys.stdout, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
