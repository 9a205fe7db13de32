"""HumanEval (openai/human-eval, MIT) in the code layout `straddle eval route` reads.

Writes `{task_id, prompt, test_setup_code, tests}` lines: the prompt is EvalPlus's
instruction for chat models with the task's stub in a fence, the one test is the task's
`check` on its entry point. Evaluation only: never train on it.

    python3 humaneval_layout.py HumanEval.jsonl > DIR/code/humaneval.jsonl
"""
import json
import sys

INSTRUCTION = ("Please provide a self-contained Python script that solves the following "
               "problem in a markdown code block:\n")


def main(path):
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            task = json.loads(line)
            print(json.dumps({
                "task_id": task["task_id"],
                "prompt": INSTRUCTION + "```\n" + task["prompt"].strip() + "\n```\n",
                "test_setup_code": "",
                "tests": [task["test"] + "\ncheck(" + task["entry_point"] + ")\n"],
            }))


if __name__ == "__main__":
    main(sys.argv[1])
