"""Writes llama.cpp reference outputs for the engine's golden tests.

Regenerate (builds llama.cpp through llama-cpp-python, about 6 minutes the first time):
    python3 -m venv tests/reference/.venv
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" \
        tests/reference/.venv/bin/pip install llama-cpp-python==0.3.36
    tests/reference/.venv/bin/python tests/reference/make_reference.py \
        ~/.cache/straddle/models/smollm2-135m-instruct-q4_1.gguf > tests/reference/smollm2-135m-q4_1.json

(GGML_NATIVE=ON built a binary that died with SIGILL on this machine's AVX-512 CPU.)
For each prompt: the prompt's token ids, the greedy continuation of up to 32 tokens (ending
early at end-of-turn), and the top-5 logits before each generated token.
"""
import json
import sys

import numpy as np
from llama_cpp import Llama

SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


def chat(*turns):
    out = SYSTEM
    for role, text in turns:
        out += f"<|im_start|>{role}\n{text}<|im_end|>\n"
    return out + "<|im_start|>assistant\n"


PROMPTS = [
    ("en-capital", chat(("user", "What is the capital of France?"))),
    ("en-story", "Once upon a time, in a small village by the sea,"),
    ("en-list", chat(("user", "List three primary colors."))),
    ("zh-greeting", chat(("user", "你好，请介绍一下你自己。"))),
    ("zh-text", "北京是中国的首都，"),
    ("code-python", "def fibonacci(n):\n    \"\"\""),
    ("code-chat", chat(("user", "Write a Python function that reverses a string."))),
    ("conversation", chat(("user", "My favourite fruit is mango."), ("assistant", "Mangoes are delicious!"), ("user", "What is my favourite fruit?"))),
]


def main(model_path):
    llm = Llama(model_path=model_path, n_ctx=512, n_threads=2, logits_all=True, verbose=False)
    eos = {2}
    cases = []
    for name, text in PROMPTS:
        llm.reset()
        toks = llm.tokenize(text.encode(), add_bos=False, special=True)
        llm.eval(toks)
        gen, steps = [], []
        for _ in range(32):
            logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
            top = np.argsort(-logits)[:5]
            steps.append([[int(i), float(logits[i])] for i in top])
            tok = int(top[0])
            gen.append(tok)
            if tok in eos:
                break
            llm.eval([tok])
        cases.append({"name": name, "prompt": text, "prompt_tokens": toks, "greedy": gen, "top5": steps})
    json.dump({"model": "SmolLM2-135M-Instruct.Q4_1.gguf", "generator": "llama-cpp-python 0.3.36, n_threads=2", "cases": cases}, sys.stdout, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
