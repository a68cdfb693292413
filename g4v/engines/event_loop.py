"""An asyncio event loop on a daemon thread: how synchronous code (CLI loops, Gradio generators,
tests) drives vLLM's asyncio engine (:mod:`g4v.engines.vllm_engine`)."""

import asyncio
import threading


class LoopThread:
    """An asyncio event loop on a daemon thread, so synchronous code can drive ``AsyncLLM``."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="g4v-vllm-loop", daemon=True)
        self.thread.start()

    def submit(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def run(self, coroutine, timeout: float | None = None):
        return self.submit(coroutine).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
