"""with_cleanup: bounded cleanup on every exit path; the body's outcome is kept."""

import anyio
import trio

from trio_batch_llm import CLEANUP_TIMED_OUT, with_cleanup


async def main() -> None:
    async def body() -> str:
        await anyio.sleep(0.01)
        raise ValueError("the upload failed")

    async def cleanup() -> None:
        await (
            anyio.sleep_forever()
        )  # a cleanup that never returns: cut off at its bound

    try:
        await with_cleanup(body, cleanup, cleanup_timeout=0.05)
    except ValueError as exc:
        print(f"body error kept: {exc}; note: {exc.__notes__ == [CLEANUP_TIMED_OUT]}")

    async def fine() -> int:
        await anyio.lowlevel.checkpoint()
        return 42

    async def tidy() -> None:
        await anyio.lowlevel.checkpoint()

    print("value:", await with_cleanup(fine, tidy, cleanup_timeout=1.0))


if __name__ == "__main__":
    trio.run(main)
