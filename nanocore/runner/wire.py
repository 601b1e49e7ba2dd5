"""The messages between rank 0 and its worker ranks, as data: JSON of names, numbers and lists, never pickle.

Unpickling bytes that arrive from another process (let alone another host) runs whatever they say; a typed
message can only be the data it claims to be. A message is a 4-byte little-endian header length, the JSON header
``{"v": PROTOCOL, "m": kind, "a": [args], "r": ragged}`` and a payload: a step plan's ``token_ids`` and
``block_table`` columns travel as little-endian int64 runs (their row lengths in ``r``), four times cheaper than JSON
numbers at hundreds of rows. Each side names the kinds it accepts and their argument count; anything else is a
``MalformedMessage``.
"""
from __future__ import annotations

import json
import struct
import sys
from array import array
from itertools import chain

from nanocore.runner.step_plan import StepOutput, StepPlan, encode_plan

#: bumped when a message changes shape: ranks of different nanocore versions then fail at the first message
PROTOCOL = 2

#: rank 0 -> workers: the method each worker runs and its number of arguments
WORKER_CALLS = {"execute": 1, "prompt_logits": 2, "exit": 0}
#: spawned worker -> rank 0 (through its pipe): start-up stages and errors
WORKER_REPLIES = {"validated": 0, "loaded": 0, "ready": 2, "error": 2}
#: the last pipeline stage -> rank 0: a step's samples (seq ids, token ids, logprobs, prompt logprobs)
STAGE_REPLIES = {"step_output": 4}

#: the columns ``encode_plan`` writes (taken from it, so a new column needs no change here)
PLAN_KEYS = frozenset(encode_plan(StepPlan([])))


class MalformedMessage(ValueError):
    """Bytes from another rank that are not a message this side accepts."""


#: the plan columns of int lists that travel in the payload, in this order
RAGGED_COLUMNS = ("token_ids", "block_table")
_HEADER_LEN = struct.Struct("<I")


def encode_message(kind: str, *args) -> bytes:
    """``kind(*args)`` as bytes; a first argument that is a plan's columns (``encode_plan``) packs its int lists."""
    ragged, payload = None, b""
    if args and isinstance(args[0], dict) and "token_ids" in args[0]:
        plan = dict(args[0])
        ragged = [[len(row) for row in plan.pop(name)] for name in RAGGED_COLUMNS]
        payload = _int64_bytes(list(chain.from_iterable(chain.from_iterable(args[0][name] for name in RAGGED_COLUMNS))))
        args = (plan, *args[1:])
    header = json.dumps({"v": PROTOCOL, "m": kind, "a": list(args), "r": ragged}, separators=(",", ":")).encode()
    return _HEADER_LEN.pack(len(header)) + header + payload


def decode_message(data: bytes, accepted: dict[str, int]) -> tuple[str, list]:
    """(kind, args) of ``data``; MalformedMessage unless it is a message of a kind in ``accepted`` with its arity."""
    if len(data) < _HEADER_LEN.size or _HEADER_LEN.unpack_from(data)[0] > len(data) - _HEADER_LEN.size:
        raise MalformedMessage(_problem("it is shorter than its header says", data))
    end = _HEADER_LEN.size + _HEADER_LEN.unpack_from(data)[0]
    try:
        message = json.loads(data[_HEADER_LEN.size:end])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedMessage(_problem(f"its header is not JSON ({exc})", data)) from None
    if not isinstance(message, dict) or set(message) != {"v", "m", "a", "r"}:
        raise MalformedMessage(_problem("its header is not an object with keys v, m, a, r", data))
    version, kind, args = message["v"], message["m"], message["a"]
    if version != PROTOCOL:
        raise MalformedMessage(_problem(f"protocol version {version!r}, this rank speaks {PROTOCOL}: run the same "
                                        f"nanocore version on every node", data))
    if not isinstance(kind, str) or kind not in accepted:
        raise MalformedMessage(_problem(f"unknown kind {kind!r} (expected one of {sorted(accepted)})", data))
    if not isinstance(args, list) or len(args) != accepted[kind]:
        raise MalformedMessage(_problem(f"{kind!r} takes {accepted[kind]} argument(s)", data))
    if kind in ("execute", "prompt_logits"):
        if not isinstance(args[0], dict):
            raise MalformedMessage("malformed message from rank 0: a step plan must be an object of columns")
        args[0].update(_unpack_ragged(message["r"], data[end:]))
        check_plan_columns(args[0])
    elif message["r"] is not None or len(data) > end:
        raise MalformedMessage(_problem(f"{kind!r} carries no payload", data))
    return kind, args


def _int64_bytes(values: list[int]) -> bytes:
    return struct.pack(f"<{len(values)}q", *values)  # one C call: faster than array("q", values) from a list


def _unpack_ragged(lengths, payload: bytes) -> dict[str, list[list[int]]]:
    """The plan's int-list columns from the payload, cut at the row lengths the header gives."""
    if not (isinstance(lengths, list) and len(lengths) == len(RAGGED_COLUMNS) and all(
            isinstance(column, list) and all(type(n) is int and n >= 0 for n in column) for column in lengths)):
        raise MalformedMessage("malformed message from rank 0: a step plan needs the row lengths of "
                               f"{RAGGED_COLUMNS} as lists of non-negative ints, got {str(lengths)[:200]}")
    needed = 8 * sum(map(sum, lengths))
    if len(payload) != needed:
        raise MalformedMessage(f"malformed message from rank 0: its payload holds {len(payload)} bytes, the row "
                               f"lengths need {needed}")
    ints = array("q")
    ints.frombytes(payload)
    if sys.byteorder == "big":
        ints.byteswap()
    flat, start, columns = ints.tolist(), 0, {}
    for name, column in zip(RAGGED_COLUMNS, lengths):
        rows = columns[name] = []
        for n in column:
            rows.append(flat[start:start + n])
            start += n
    return columns


def check_plan_columns(columns) -> None:
    """The shape ``encode_plan`` writes: the named columns, row columns of lists, sampling settings of 8 values."""
    if not isinstance(columns, dict) or set(columns) != PLAN_KEYS:
        keys = sorted(columns) if isinstance(columns, dict) else type(columns).__name__
        raise MalformedMessage(f"malformed message from rank 0: a step plan needs the columns {sorted(PLAN_KEYS)}, "
                               f"got {keys}")
    for name in PLAN_KEYS - {"ahead_rows"}:
        if not isinstance(columns[name], list):
            raise MalformedMessage(f"malformed message from rank 0: step plan column {name!r} is not a list")
    for name, kind in (("token_ids", list), ("block_table", list), ("sampling", list), ("seq_id", int),
                       ("start", int), ("samples", bool), ("num_output_tokens", int), ("sampling_index", int)):
        if not all(type(v) is kind for v in columns[name]):
            raise MalformedMessage(f"malformed message from rank 0: step plan column {name!r} holds a value that "
                                   f"is not {kind.__name__}")
    if any(len(s) != 8 or not isinstance(s[-1], list) for s in columns["sampling"]):
        raise MalformedMessage("malformed message from rank 0: a sampling setting needs 8 values, the last a list")
    if not all(t is None or (isinstance(t, list) and all(type(i) is int for i in t)) for t in columns["prompt_targets"]):
        raise MalformedMessage("malformed message from rank 0: a prompt_targets entry is null or a list of ints")
    if not all(type(n) is int and n >= 0 for n in columns["num_prompt_logprobs"]):
        raise MalformedMessage("malformed message from rank 0: num_prompt_logprobs holds a value that is not an int >= 0")
    ahead = columns["ahead_rows"]
    if ahead is not None and not (isinstance(ahead, list) and all(type(i) is int and i >= 0 for i in ahead)):
        raise MalformedMessage("malformed message from rank 0: ahead_rows is null or a list of row indices")
    for name in ("finished_seq_ids", "reset_seq_ids"):
        if not all(type(i) is int for i in columns[name]):
            raise MalformedMessage(f"malformed message from rank 0: {name} holds a value that is not an int")
    if not all(isinstance(row, list) and all(isinstance(pair, list) and len(pair) == 2 and type(pair[0]) is int
                                             and type(pair[1]) in (int, float) for pair in row)
               for row in columns["logit_bias"]):
        raise MalformedMessage("malformed message from rank 0: a logit_bias row is a list of [token id, bias] pairs")


def _problem(what: str, data: bytes) -> str:
    head = bytes(data[:80])
    return f"malformed message between nanocore ranks: {what}; first bytes {head!r}"


def encode_step_output(output: StepOutput) -> bytes:
    """A step's samples as a typed message (prompt logprobs as ``[seq_id, entries]`` pairs: JSON keys are text)."""
    prompt = None if output.prompt_logprobs is None else [[k, v] for k, v in output.prompt_logprobs.items()]
    return encode_message("step_output", output.seq_ids, output.token_ids, output.logprobs, prompt)


def decode_step_output(data: bytes) -> StepOutput:
    """The ``StepOutput`` that ``encode_step_output`` wrote; MalformedMessage on anything else."""
    _, (seq_ids, token_ids, logprobs, prompt) = decode_message(data, STAGE_REPLIES)
    ints = isinstance(seq_ids, list) and isinstance(token_ids, list) and len(seq_ids) == len(token_ids) and all(
        type(v) is int for v in seq_ids + token_ids)
    if not ints or not (logprobs is None or _entries(logprobs) and len(logprobs) == len(seq_ids)) or not (
            prompt is None or isinstance(prompt, list) and all(
                isinstance(p, list) and len(p) == 2 and type(p[0]) is int and _entries(p[1]) for p in prompt)):
        raise MalformedMessage("malformed message from the last pipeline stage: a step output needs equal lists of "
                               "int seq ids and token ids, and logprob entries [ids, logprobs, rank]")
    return StepOutput(seq_ids, token_ids, None if logprobs is None else [tuple(e) for e in logprobs],
                      None if prompt is None else {seq: [tuple(e) for e in entries] for seq, entries in prompt})


def _entries(entries) -> bool:
    return isinstance(entries, list) and all(isinstance(e, list) and len(e) == 3 for e in entries)
