"""The README's exchange with the embedded model: a tool call and a thinking answer through the openai client.

Start ``dsa-runtime serve``, then ``python examples/tiny_chat_client.py [BASE_URL]`` (it waits for the server).
"""

import sys
import time
import urllib.request

from openai import OpenAI

base_url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:30000/v1"
# Started next to `dsa-runtime serve` (README's first command): wait up to a minute for /health.
for _ in range(120):
    try:
        with urllib.request.urlopen(base_url.rsplit("/v1", 1)[0] + "/health", timeout=2):
            break
    except OSError:
        time.sleep(0.5)
else:
    sys.exit(f"no server answered at {base_url} within 60 s")
client = OpenAI(base_url=base_url, api_key="none")
weather = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
r = client.chat.completions.create(model="tiny-chat", temperature=0, tools=[weather],
                                   messages=[{"role": "user", "content": "What's the weather like in Paris?"}])
call = r.choices[0].message.tool_calls[0].function
print(f"tool call: {call.name}({call.arguments})")
r = client.chat.completions.create(model="tiny-chat", temperature=0,
                                   messages=[{"role": "user", "content": "What is 47 + 38?"}],
                                   extra_body={"chat_template_kwargs": {"thinking": True}})
msg = r.choices[0].message
print(f"reasoning: {getattr(msg, 'reasoning_content', None)}")
print(f"answer: {msg.content}")
