"""llama.cpp's throughput on the same GGUF and the same token pattern as our engine's bench.

Run by `cargo xtask bench engine` with the venv of make_reference.py. Prints one JSON line.
"""
import json
import sys
import time

from llama_cpp import Llama

path, n_prompt, n_decode, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
t = time.perf_counter()
# n_batch = n_ctx: llama-cpp-python keeps n_batch rows of scores, and a 512-token prompt then
# decode would index past them; llama.cpp still computes in ubatches of 512.
llm = Llama(model_path=path, n_ctx=2048, n_threads=threads, n_batch=2048, verbose=False)
load_ms = (time.perf_counter() - t) * 1e3
prompt = [1000 + (i * 37) % 20000 for i in range(n_prompt)]
t = time.perf_counter()
llm.eval(prompt)
prefill = time.perf_counter() - t
t = time.perf_counter()
for _ in range(n_decode):
    tok = int(llm.scores[llm.n_tokens - 1].argmax())
    llm.eval([tok])
decode = time.perf_counter() - t
print(json.dumps({"engine": "llama.cpp", "threads": threads, "load_ms": round(load_ms), "prefill_tps": round(n_prompt / prefill, 1), "decode_tps": round(n_decode / decode, 1)}))
