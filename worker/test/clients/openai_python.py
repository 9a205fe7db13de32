"""The official `openai` Python package against an OpenAI-compatible endpoint of ours.

Run by `clients.test.mjs` against the cloud server (`OfficialPythonClient`) and against the
worker in front of it (that and `ThroughTheWorker`): STRADDLE_BASE_URL is the `/v1` base,
STRADDLE_API_KEY the bearer (a tenant token for the worker), STRADDLE_ORIGIN the page origin
the worker expects (unset for the cloud server).
"""

import os
import unittest

import openai

BASE_URL = os.environ["STRADDLE_BASE_URL"]
API_KEY = os.environ.get("STRADDLE_API_KEY", "unused")
ORIGIN = os.environ.get("STRADDLE_ORIGIN")
ASK = [{"role": "user", "content": "Name three primary colors."}]


def client(api_key=API_KEY):
    headers = {"origin": ORIGIN} if ORIGIN else None
    return openai.OpenAI(base_url=BASE_URL, api_key=api_key, default_headers=headers, max_retries=0, timeout=120)


class OfficialPythonClient(unittest.TestCase):
    def test_whole_answer_with_usage(self):
        r = client().chat.completions.create(model="smollm2", messages=ASK, max_tokens=12, temperature=0)
        choice = r.choices[0]
        self.assertTrue(choice.message.content)
        self.assertEqual(choice.message.role, "assistant")
        self.assertIn(choice.finish_reason, ("stop", "length"))
        self.assertGreater(r.usage.prompt_tokens, 0)
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens)

    def test_streamed_answer_equals_the_whole_one_and_ends_with_usage(self):
        whole = client().chat.completions.create(model="smollm2", messages=ASK, max_tokens=12, temperature=0)
        stream = client().chat.completions.create(
            model="smollm2", messages=ASK, max_tokens=12, temperature=0,
            stream=True, stream_options={"include_usage": True},
        )
        text, usage, finish = "", None, None
        for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage:
                usage = chunk.usage
        self.assertEqual(text, whole.choices[0].message.content)
        self.assertEqual(finish, whole.choices[0].finish_reason)
        self.assertIsNotNone(usage)
        self.assertEqual(usage.completion_tokens, whole.usage.completion_tokens)

    def test_an_invalid_request_is_the_clients_bad_request_error_naming_the_field(self):
        with self.assertRaises(openai.BadRequestError) as caught:
            client().chat.completions.create(model="smollm2", messages=ASK, temperature=3)
        self.assertEqual(caught.exception.status_code, 400)
        self.assertEqual(caught.exception.param, "temperature")

    def test_an_unknown_tool_choice_is_a_bad_request_error(self):
        with self.assertRaises(openai.BadRequestError) as caught:
            client().chat.completions.create(model="smollm2", messages=ASK, tool_choice="required")
        self.assertEqual(caught.exception.param, "tool_choice")

    def test_an_abandoned_stream_leaves_the_server_answering(self):
        stream = client().chat.completions.create(model="smollm2", messages=ASK, max_tokens=200, stream=True)
        for _ in stream:
            break
        stream.close()
        r = client().chat.completions.create(model="smollm2", messages=ASK, max_tokens=4)
        self.assertTrue(r.choices[0].message.content)


class ThroughTheWorker(unittest.TestCase):
    """What only the worker checks: the cloud server behind it takes no token."""

    def test_a_bad_token_is_the_clients_authentication_error(self):
        with self.assertRaises(openai.AuthenticationError) as caught:
            client(api_key="not-a-token").chat.completions.create(model="smollm2", messages=ASK)
        self.assertEqual(caught.exception.status_code, 401)


if __name__ == "__main__":
    unittest.main(verbosity=2)
