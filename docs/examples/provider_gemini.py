"""GeminiStrategy: Gemini's generateContent, structured output and a context cache, against the mock."""

import trio
from pydantic import BaseModel

from trio_batch_llm import GeminiContextCache, GeminiStrategy, llm, process_prompts
from trio_batch_llm.mock import MockServerConfig, serve_mock

HANDBOOK = "You answer questions about the Example Corp staff handbook. " * 40  # a long shared prefix


class Capital(BaseModel):
    city: str


async def main() -> None:
    async with serve_mock(MockServerConfig(api_key="mock-key")) as server:
        strategy = GeminiStrategy(
            "gemini-2.5-flash",
            base_url=server.url,  # the API root; "/v1beta" is added. Default: Google's own API
            api_key="mock-key",  # else GEMINI_API_KEY / GOOGLE_API_KEY, sent only to Google
            system_prompt="Answer in one word.",
            temperature=0.0,
            max_output_tokens=16,
        )
        print(strategy.request_body("Capital of France?"))  # exactly what will be sent

        batch = await process_prompts(strategy, ["Capital of France?", "Capital of Peru?"])
        print([result.output is not None for result in batch.in_input_order()])

        # Structured output: responseMimeType application/json + responseJsonSchema, validated here.
        structured = GeminiStrategy("gemini-2.5-flash", base_url=server.url, api_key="mock-key",
                                    response_model=Capital)
        answer = await process_prompts(structured, ["Capital of Norway?"])
        print(type(answer.outputs()[0]).__name__)

        # A context cache: the handbook is stored once, every request names it, and it is
        # deleted when the batch ends.
        cached = GeminiStrategy("gemini-2.5-flash", base_url=server.url, api_key="mock-key",
                                system_prompt=HANDBOOK, context_cache=GeminiContextCache(ttl=600))
        batch = await process_prompts(cached, [f"Question {n}?" for n in range(4)])
        usage = batch.total_tokens()
        print("succeeded:", len(batch.successes()), "cached tokens > 0:", usage["cached_input_tokens"] > 0)

        # The same strategy from a short spec; keyword arguments go to the constructor.
        short = llm("gemini:gemini-2.5-flash", base_url=server.url, api_key="mock-key")
        print(type(short).__name__, short.model_name)


if __name__ == "__main__":
    trio.run(main)
