"""``SamplingParams`` and ``RequestOutputKind`` of the vLLM stand-in."""

import enum


class RequestOutputKind(enum.Enum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


class SamplingParams:
    def __init__(self, **fields) -> None:
        self.__dict__.update(fields)
