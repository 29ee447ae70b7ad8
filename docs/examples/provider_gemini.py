"""GeminiStrategy: generateContent, structured output and a context cache."""

import trio
from pydantic import BaseModel

from trio_batch_llm import GeminiContextCache, GeminiStrategy, llm, process_prompts
from trio_batch_llm.mock import MockServerConfig, serve_mock

# A long prefix every request shares (Gemini caches 1,024 tokens or more).
HANDBOOK = "You answer questions about the Example Corp staff handbook. " * 40


class Capital(BaseModel):
    city: str


async def main() -> None:
    async with serve_mock(MockServerConfig(api_key="mock-key")) as server:
        strategy = GeminiStrategy(
            "gemini-2.5-flash",
            # The API root ("/v1beta" is added); by default Google's own API.
            base_url=server.url,
            # Else GEMINI_API_KEY or GOOGLE_API_KEY, which go only to Google.
            api_key="mock-key",
            system_prompt="Answer in one word.",
            temperature=0.0,
            max_output_tokens=16,
        )
        print(strategy.request_body("Capital of France?"))  # what is sent

        prompts = ["Capital of France?", "Capital of Peru?"]
        batch = await process_prompts(strategy, prompts)
        print([result.output is not None for result in batch.in_input_order()])

        # Structured output: responseMimeType application/json with the schema
        # as responseJsonSchema; the answer is validated into the model.
        structured = GeminiStrategy(
            "gemini-2.5-flash", base_url=server.url, api_key="mock-key",
            response_model=Capital,
        )
        answer = await process_prompts(structured, ["Capital of Norway?"])
        print(type(answer.outputs()[0]).__name__)

        # A context cache: the handbook is stored once, every request names
        # it, and it is deleted when the batch ends.
        cached = GeminiStrategy(
            "gemini-2.5-flash", base_url=server.url, api_key="mock-key",
            system_prompt=HANDBOOK, context_cache=GeminiContextCache(ttl=600),
        )
        questions = [f"Question {n}?" for n in range(4)]
        batch = await process_prompts(cached, questions)
        cached_tokens = batch.total_tokens().get("cached_input_tokens", 0)
        succeeded = len(batch.successes())
        print("succeeded:", succeeded, "cached tokens > 0:", cached_tokens > 0)

        # The same strategy from a short spec; keywords go to the constructor.
        short = llm("gemini:gemini-2.5-flash", base_url=server.url, api_key="mock-key")
        print(type(short).__name__, short.model_name)


if __name__ == "__main__":
    trio.run(main)
