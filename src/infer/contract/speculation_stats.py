"""Counters of speculative decoding, which the engine keeps and the server's metrics show."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SpeculationStats:
    """Totals since start: rows that checked proposals, tokens proposed and accepted, and
    how often the proposal at each position (first, second, ...) was accepted."""

    num_verify_steps: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_by_position: tuple[int, ...] = ()  # (a tuple: snapshots share it safely)

    def record(self, proposed: int, accepted: int) -> None:
        self.num_verify_steps += 1
        self.num_draft_tokens += proposed
        self.num_accepted_tokens += accepted
        if accepted:
            counts = list(self.accepted_by_position)
            counts += [0] * (accepted - len(counts))
            for position in range(accepted):
                counts[position] += 1
            self.accepted_by_position = tuple(counts)

    def since(self, earlier: SpeculationStats) -> SpeculationStats:
        """What was counted after ``earlier`` (a copy taken then)."""
        before = earlier.accepted_by_position
        return SpeculationStats(
            self.num_verify_steps - earlier.num_verify_steps,
            self.num_draft_tokens - earlier.num_draft_tokens,
            self.num_accepted_tokens - earlier.num_accepted_tokens,
            tuple(
                count - (before[i] if i < len(before) else 0)
                for i, count in enumerate(self.accepted_by_position)
            ),
        )

    def as_dict(self) -> dict[str, float | int | list[int]]:
        return {
            "verify_steps": self.num_verify_steps,
            "draft_tokens": self.num_draft_tokens,
            "accepted_tokens": self.num_accepted_tokens,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_accepted_length": round(self.mean_accepted_length, 4),
            "accepted_by_position": list(self.accepted_by_position),
        }

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens a proposing row produced per verification, its own sample included."""
        if not self.num_verify_steps:
            return 0.0
        return 1.0 + self.num_accepted_tokens / self.num_verify_steps
