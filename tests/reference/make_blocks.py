"""Writes reference dequantizations of random GGML blocks for the block-format tests.

Regenerate (PyPI's `gguf` package, whose NumPy dequantizers follow ggml's C ones):
    python3 -m venv /tmp/gguf-venv && /tmp/gguf-venv/bin/pip install gguf==0.19.0 numpy
    /tmp/gguf-venv/bin/python tests/reference/make_blocks.py > tests/reference/blocks.json

Each block is random bytes with its f16 scales replaced by finite values of a realistic
size, so every bit of the quantized payload is exercised.
"""
import json
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

# Byte offsets of each type's f16 scale fields inside one block.
SCALES = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}
BLOCK_BYTES = {T.Q4_0: 18, T.Q4_1: 20, T.Q5_0: 22, T.Q5_1: 24, T.Q8_0: 34, T.Q4_K: 144, T.Q5_K: 176, T.Q6_K: 210}


def block(rng, ty):
    b = bytearray(rng.integers(0, 256, BLOCK_BYTES[ty], dtype=np.uint8).tobytes())
    for at in SCALES[ty]:
        b[at:at + 2] = np.float16(rng.normal(0, 0.02)).tobytes()
    return bytes(b)


def main():
    rng = np.random.default_rng(20261202)
    out = {}
    for ty in SCALES:
        cases = []
        for _ in range(4):
            raw = block(rng, ty)
            values = dequantize(np.frombuffer(raw, dtype=np.uint8), ty).astype(np.float32)
            cases.append({"bytes": raw.hex(), "values": [float(v) for v in values]})
        out[ty.name] = cases
    json.dump({"generator": "gguf (PyPI) quants.dequantize", "blocks": out}, sys.stdout)


if __name__ == "__main__":
    main()
