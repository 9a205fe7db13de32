"""Writes llama.cpp reference outputs for the engine's golden tests.

Regenerate (builds llama.cpp through llama-cpp-python, about 6 minutes the first time):
    python3 -m venv tests/reference/.venv
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" \
        tests/reference/.venv/bin/pip install llama-cpp-python==0.3.36
    tests/reference/.venv/bin/python tests/reference/make_reference.py smollm2 \
        ~/.cache/straddle/models/smollm2-135m-instruct-q4_1.gguf > tests/reference/smollm2-135m-q4_1.json
    tests/reference/.venv/bin/python tests/reference/make_reference.py gemma3 \
        ~/.cache/straddle/models/gemma-3-270m-q4_k_m.gguf > tests/reference/gemma-3-270m-q4_k_m.json
    tests/reference/.venv/bin/python tests/reference/make_reference.py qwen \
        ~/.cache/straddle/models/qwen2.5-coder-0.5b-instruct.gguf > tests/reference/qwen2.5-coder-0.5b.json
    tests/reference/.venv/bin/python tests/reference/make_reference.py qwen \
        ~/.cache/straddle/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf > tests/reference/qwen2.5-coder-1.5b.json

(GGML_NATIVE=ON built a binary that died with SIGILL on this machine's AVX-512 CPU.)
For each prompt: the prompt's token ids, the conversation it renders (`messages`, for the
chat-template cases, so the test can render them with the GGUF's own template), the greedy continuation of up to 32 tokens (ending
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


SMOLLM2 = [
    ("en-capital", chat(("user", "What is the capital of France?"))),
    ("en-story", "Once upon a time, in a small village by the sea,"),
    ("en-list", chat(("user", "List three primary colors."))),
    ("zh-greeting", chat(("user", "你好，请介绍一下你自己。"))),
    ("zh-text", "北京是中国的首都，"),
    ("code-python", "def fibonacci(n):\n    \"\"\""),
    ("code-chat", chat(("user", "Write a Python function that reverses a string."))),
    ("conversation", chat(("user", "My favourite fruit is mango."), ("assistant", "Mangoes are delicious!"), ("user", "What is my favourite fruit?"))),
]

# Gemma 3 270M is a base model: mostly plain continuations, in several of its languages, and
# one turn in Gemma's chat format (its control tokens).
GEMMA3 = [
    ("en-story", "Once upon a time, in a small village by the sea,"),
    ("en-fact", "The capital of France is"),
    ("de-text", "Die Hauptstadt von Deutschland ist"),
    ("ja-text", "日本の首都は"),
    ("zh-text", "北京是中国的首都，"),
    ("code-python", "def fibonacci(n):\n    \"\"\""),
    ("list", "Three primary colors:\n1."),
    ("chat-turn", "<start_of_turn>user\nWhat is the capital of Italy?<end_of_turn>\n<start_of_turn>model\n"),
]

QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def qwen_chat(*turns):
    """Qwen 2.5's template as it renders a conversation without a system turn: its default
    system prompt first. Returns the text and the conversation."""
    out = f"<|im_start|>system\n{QWEN_SYSTEM}<|im_end|>\n"
    for role, text in turns:
        out += f"<|im_start|>{role}\n{text}<|im_end|>\n"
    return out + "<|im_start|>assistant\n", [{"role": r, "content": t} for r, t in turns]


# Qwen2.5-Coder 0.5B and 1.5B Instruct: one tokenizer (the `qwen2` pre-tokenizer: digits one
# at a time, CJK, code), chat turns through Qwen's template, and raw continuations.
QWEN = [
    ("en-capital", *qwen_chat(("user", "What is the capital of France?"))),
    ("en-story", "Once upon a time, in a small village by the sea,", None),
    ("code-python", "def fibonacci(n):\n    \"\"\"", None),
    ("code-chat", *qwen_chat(("user", "Write a Python function that reverses a string."))),
    ("json-chat", *qwen_chat(("user", 'Give {"name": "Ada", "born": 1815} as YAML.'))),
    ("zh-chat", *qwen_chat(("user", "用一句话介绍北京。"))),
    ("numbers", "The sum of 12345 and 67890 is", None),
    ("conversation", *qwen_chat(("user", "My favourite fruit is mango."), ("assistant", "Mangoes are delicious!"), ("user", "What is my favourite fruit?"))),
]

MODELS = {
    "smollm2": ("SmolLM2-135M-Instruct.Q4_1.gguf", SMOLLM2, False),
    "gemma3": ("gemma-3-270m-q4_k_m.gguf", GEMMA3, True),
    "qwen": (None, QWEN, False),
}


def main(which, model_path):
    file_name, prompts, add_bos = MODELS[which]
    file_name = file_name or model_path.rsplit("/", 1)[-1]
    # Logits of the last position only, as a server computes them: with every position's, the
    # head runs as a matrix product over the prompt, whose sums llama.cpp orders otherwise
    # (a K-quant head then differs in the last bit from what a server returns).
    llm = Llama(model_path=model_path, n_ctx=512, n_threads=2, logits_all=False, verbose=False)
    eos = {llm.token_eos()}
    cases = []
    for name, text, *conversation in prompts:
        llm.reset()
        toks = llm.tokenize(text.encode(), add_bos=add_bos, special=True)
        llm.eval(toks)
        gen, steps = [], []
        for _ in range(32):
            # llama-cpp-python keeps no scores without `logits_all`: read the context's.
            last = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))
            logits = np.array(last, dtype=np.float64)
            top = np.argsort(-logits)[:5]
            steps.append([[int(i), float(logits[i])] for i in top])
            tok = int(top[0])
            gen.append(tok)
            if tok in eos:
                break
            llm.eval([tok])
        case = {"name": name, "prompt": text, "prompt_tokens": toks, "greedy": gen, "top5": steps}
        if conversation and conversation[0]:
            case["messages"] = conversation[0]
        cases.append(case)
    json.dump({"model": file_name, "generator": "llama-cpp-python 0.3.36, n_threads=2", "cases": cases}, sys.stdout, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
