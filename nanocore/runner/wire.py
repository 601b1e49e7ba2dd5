"""The messages between rank 0 and its worker ranks, as data: JSON of names, numbers and lists, never pickle.

Unpickling bytes that arrive from another process (let alone another host) runs whatever they say; a JSON
message can only be the data it claims to be. Every message is ``{"v": PROTOCOL, "m": kind, "a": [args]}``;
each side names the kinds it accepts and their argument count, and anything else is a ``MalformedMessage``.
"""
from __future__ import annotations

import json

#: bumped when a message changes shape: ranks of different nanocore versions then fail at the first message
PROTOCOL = 1

#: rank 0 -> workers: the method each worker runs and its number of arguments
WORKER_CALLS = {"execute": 1, "prompt_logits": 2, "exit": 0}
#: spawned worker -> rank 0 (through its pipe): start-up stages and errors
WORKER_REPLIES = {"validated": 0, "loaded": 0, "ready": 2, "error": 2}

PLAN_KEYS = frozenset({"seq_id", "start", "token_ids", "block_table", "samples", "num_output_tokens", "sampling",
                       "finished_seq_ids", "reset_seq_ids", "ahead_rows"})


class MalformedMessage(ValueError):
    """Bytes from another rank that are not a message this side accepts."""


def encode_message(kind: str, *args) -> bytes:
    return json.dumps({"v": PROTOCOL, "m": kind, "a": list(args)}, separators=(",", ":")).encode()


def decode_message(data: bytes, accepted: dict[str, int]) -> tuple[str, list]:
    """(kind, args) of ``data``; MalformedMessage unless it is a message of a kind in ``accepted`` with its arity."""
    try:
        message = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedMessage(_problem(f"it is not JSON ({exc})", data)) from None
    if not isinstance(message, dict) or set(message) != {"v", "m", "a"}:
        raise MalformedMessage(_problem("it is not an object with keys v, m, a", data))
    version, kind, args = message["v"], message["m"], message["a"]
    if version != PROTOCOL:
        raise MalformedMessage(_problem(f"protocol version {version!r}, this rank speaks {PROTOCOL}: run the same "
                                        f"nanocore version on every node", data))
    if not isinstance(kind, str) or kind not in accepted:
        raise MalformedMessage(_problem(f"unknown kind {kind!r} (expected one of {sorted(accepted)})", data))
    if not isinstance(args, list) or len(args) != accepted[kind]:
        raise MalformedMessage(_problem(f"{kind!r} takes {accepted[kind]} argument(s)", data))
    if kind in ("execute", "prompt_logits"):
        check_plan_columns(args[0])
    return kind, args


def check_plan_columns(columns) -> None:
    """The shape ``encode_plan`` writes: the named columns, row columns of lists, sampling rows of 8 values."""
    if not isinstance(columns, dict) or set(columns) != PLAN_KEYS:
        keys = sorted(columns) if isinstance(columns, dict) else type(columns).__name__
        raise MalformedMessage(f"malformed message from rank 0: a step plan needs the columns {sorted(PLAN_KEYS)}, "
                               f"got {keys}")
    for name in PLAN_KEYS - {"ahead_rows"}:
        if not isinstance(columns[name], list):
            raise MalformedMessage(f"malformed message from rank 0: step plan column {name!r} is not a list")
    for name, kind in (("token_ids", list), ("block_table", list), ("sampling", list), ("seq_id", int),
                       ("start", int), ("samples", bool), ("num_output_tokens", int)):
        if not all(type(v) is kind for v in columns[name]):
            raise MalformedMessage(f"malformed message from rank 0: step plan column {name!r} holds a value that "
                                   f"is not {kind.__name__}")
    if any(len(s) != 8 or not isinstance(s[-1], list) for s in columns["sampling"]):
        raise MalformedMessage("malformed message from rank 0: a sampling row needs 8 values, the last a list")


def _problem(what: str, data: bytes) -> str:
    head = bytes(data[:80])
    return f"malformed message between nanocore ranks: {what}; first bytes {head!r}"
