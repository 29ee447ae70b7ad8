"""OpenAICompatibleStrategy and llm(): any OpenAI-compatible server, no SDK needed."""

import trio

from trio_batch_llm import OpenAICompatibleStrategy, llm, process_prompts
from trio_batch_llm.mock import serve_mock


async def main() -> None:
    async with serve_mock() as server:
        # vLLM, llama.cpp, Ollama, LiteLLM, a gateway...: anything that speaks the
        # OpenAI wire format.
        strategy = OpenAICompatibleStrategy(
            "meta-llama/Llama-3.1-8B-Instruct",
            base_url=server.base_url,  # e.g. "http://localhost:8000/v1"
            api="chat",  # or "responses"
            system_prompt="Answer in one word.",
            temperature=0.0,
            max_output_tokens=16,
            extra_body={"top_k": 20},  # merged into every request body, last
            # No key is sent: OPENAI_API_KEY goes only to api.openai.com. A server that
            # needs one:
            # api_key_env="MY_SERVER_KEY" (the name of the environment variable that
            # holds it).
        )
        print(strategy.request_body("Capital of France?"))  # exactly what will be sent

        batch = await process_prompts(
            strategy, ["Capital of France?", "Capital of Peru?"], concurrency=8
        )
        print([result.output for result in batch.in_input_order()])
        # The JSON the server decoded (raw bytes if it was not JSON):
        received = server.requests[-1].body
        assert isinstance(received, dict)
        print("the server received top_k =", received["top_k"])

        # The same strategy from a short spec; keyword arguments go to the constructor.
        short = llm(
            "openai-compatible:meta-llama/Llama-3.1-8B-Instruct",
            base_url=server.base_url,
        )
        print(type(short).__name__, short.model_name)


if __name__ == "__main__":
    trio.run(main)
