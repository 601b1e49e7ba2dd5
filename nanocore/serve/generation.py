"""One completions / chat call: submit its prompts, then stream chunks or wait for the whole body."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from nanocore.engine.sampling_params import SamplingParams
from nanocore.serve.delivery import RequestStream
from nanocore.serve.engine_client import EngineClient
from nanocore.serve.protocol import APIError, bad_request
from nanocore.serve.request_state import RequestUpdate
from nanocore.serve.responses import ResponseShape, echoed, sse, usage

DONE = "data: [DONE]\n\n"


async def generate(client: EngineClient, prompts: list[list[int]], params: SamplingParams, shape: ResponseShape,
                   stream: bool, include_usage: bool, raw: Request) -> Response:
    streams = await submit_all(client, prompts, params, stream)
    prompt_tokens = sum(len(p) for p in prompts)
    if stream:
        events = stream_events(client, streams, shape, params.n, prompt_tokens if include_usage else None, prompts)
        return StreamingResponse(events, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    updates = await wait_or_disconnect(streams, raw)
    if updates is None:
        return Response(status_code=499)  # the client left; its requests were aborted
    failed = next((u for u in updates if u.error is not None), None)
    if failed is not None:
        raise APIError(failed.status, failed.error, type="server_error" if failed.status >= 500 else
                       "invalid_request_error")
    choices = [(i * params.n + out.index, out, u.output) for i, u in enumerate(updates) for out in u.output.outputs]
    completion_tokens = sum(len(out.token_ids) for _, out, _ in choices)
    return JSONResponse(shape.body(choices, usage(prompt_tokens, completion_tokens)))


async def submit_all(client: EngineClient, prompts: list[list[int]], params: SamplingParams,
                     stream: bool) -> list[RequestStream]:
    """The prompts as one batch: every one is accepted, or none is."""
    try:
        return await client.submit(prompts, params, streaming=stream)
    except ValueError as exc:
        raise bad_request(str(exc), "prompt" if "prompt" in str(exc) else None) from None


async def wait_or_disconnect(streams: list[RequestStream], raw: Request) -> list[RequestUpdate] | None:
    """The final update of each stream, or None (everything aborted) if the client disconnects first."""
    results = asyncio.ensure_future(asyncio.gather(*(s.result() for s in streams)))
    watcher = asyncio.ensure_future(_client_gone(raw))
    done, _ = await asyncio.wait({results, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if results in done:
        watcher.cancel()
        return results.result()
    results.cancel()  # each stream's generator aborts its engine request as it unwinds
    results.add_done_callback(_retrieve)  # a cancelled gather holds a CancelledError nobody else reads
    for s in streams:
        s.client.abort(s.request_id)
    return None


def _retrieve(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


async def _client_gone(raw: Request) -> None:
    while (await raw.receive())["type"] != "http.disconnect":  # the body is read: only a disconnect can come
        pass


async def stream_events(client: EngineClient, streams: list[RequestStream], shape: ResponseShape, n: int,
                        prompt_tokens: int | None, prompts: list[list[int]]) -> AsyncIterator[str]:
    """SSE text: one write per engine update (all its choices' chunks), usage if asked, then [DONE]. With echo,
    a choice's first chunk starts with its prompt."""
    completion_tokens, text_offsets = 0, {}  # choice index -> characters streamed so far
    tool_streams = {}  # choice index -> its ToolCallStream (None: content only)
    try:
        async for prompt_index, update in merged_updates(streams):
            if update.error is not None:
                kind = "server_error" if update.status >= 500 else "invalid_request_error"
                yield sse(APIError(update.status, update.error, type=kind).body()) + DONE
                return
            chunks = []
            for delta in update.deltas:
                index = prompt_index * n + delta.index
                completion_tokens += len(delta.token_ids)
                offset = text_offsets.get(index)
                if offset is None:
                    tool_streams[index] = shape.tool_stream()
                text, token_ids, logprobs, first_token = delta.text, delta.token_ids, delta.logprobs, ""
                if offset is None and shape.echo is not None:
                    prompt_text, first_token = shape.echo_of(index)
                    text, token_ids, logprobs = echoed(prompts[prompt_index], delta.prompt_logprobs, text, token_ids,
                                                       logprobs, prompt_text)
                chunks.extend(sse(chunk) for chunk in shape.delta_chunks(
                    index, (text, token_ids, logprobs), delta.finish_reason, tool_streams[index], role=offset is None,
                    text_offset=offset or 0, first_token=first_token))
                text_offsets[index] = (offset or 0) + len(text)
            if chunks:
                yield "".join(chunks)
        if prompt_tokens is not None:
            yield sse(shape.usage_chunk(usage(prompt_tokens, completion_tokens)))
        yield DONE
    finally:
        for s in streams:
            if not s.finished:  # disconnect or error: free the KV blocks at once
                client.abort(s.request_id)


async def merged_updates(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestUpdate]]:
    """(prompt index, update) from every stream, in arrival order, until all have finished."""
    if len(streams) == 1:
        async for update in streams[0].updates():
            yield 0, update
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, s: RequestStream) -> None:
        async for update in s.updates():
            await queue.put((index, update))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            index, update = await queue.get()
            remaining -= update.finished
            yield index, update
    finally:
        for task in tasks:
            task.cancel()
