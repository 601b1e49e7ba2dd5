"""``decode_first`` scheduler policy for nanocore: decodes first, then chunked prefill in the same step."""
from nanocore_decode_first.policy import DecodeFirstPolicy

__all__ = ["DecodeFirstPolicy"]
