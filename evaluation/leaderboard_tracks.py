"""Tracks: the starting points the leaderboard ranks within.

A track is (env family, starting student, teacher or none, evaluation protocol). Two rows compete only when
they start from the same student (a method cannot win by starting from a better model), distil from the same
teacher where they distil at all, and are evaluated the same way. The bench's household run is one track:
its methods, its warm start, and its teacher evaluated as a reference row. A record from another starting
point (another student, another teacher, another protocol or other tasks) lands in a track of its own,
however close its numbers are; the budget a method spent is a column of the track's table, never a track.

Who joins which track:

- a row with a teacher: the track of its (student, teacher);
- the bench's `teacher` reference row (it evaluates the teacher itself, so its student field names the
  teacher): the track whose teacher it is;
- any other row without a teacher (GRPO, SFT, the warm start, a user's method that distils from nothing):
  the track of its student that holds the most rows (the bench's, where the bench ran from that student),
  else a track of its own with no teacher.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, TypeVar

M = TypeVar("M")

BENCH_PROTOCOL = "bench"  # the protocol part of a track evaluated the way the bench evaluates


@dataclass(frozen=True)
class Track:
    """Where a row starts from and how it is evaluated; rows rank only against rows of the same track."""

    family: str
    student: str
    teacher: str | None
    protocol: str  # BENCH_PROTOCOL, or the protocol the rows were evaluated under
    # the named bench track (`bench --track NAME`) whose preset the bench rows ran, for the title only: two
    # tracks differ by their start and protocol, never by this name
    bench_track: str = field(default="", compare=False)

    @property
    def title(self) -> str:
        teacher = f"teacher {self.teacher}" if self.teacher else "no teacher"
        bench = f"the {self.bench_track} track's protocol" if self.bench_track else "the bench's protocol"
        protocol = (bench if self.protocol == BENCH_PROTOCOL
                    else f"protocol {self.protocol}" if self.protocol else "no prompt protocol (a scripted agent)")
        return f"{self.family}: from {self.student}, {teacher}, {protocol}"

    @property
    def slug(self) -> str:
        """A stable HTML id for the track's section (letters, digits and dashes only)."""
        raw = "-".join([self.family, self.student, self.teacher or "none", self.protocol])
        return "track-" + re.sub(r"[^A-Za-z0-9]+", "-", raw).strip("-").lower()[:120]


def assign_tracks(methods: Iterable[M], family: str, *, student: Callable[[M], str],
                  teacher: Callable[[M], str | None], protocol: Callable[[M], str],
                  is_teacher_reference: Callable[[M], bool]) -> dict[Track, list[M]]:
    """Every method in its track (module docstring), tracks in first-seen order of their starts."""
    methods = list(methods)
    starts: dict[tuple[str, str], dict[str, int]] = {}  # (protocol, student) -> teacher -> rows naming it
    for m in methods:
        if teacher(m):
            by_teacher = starts.setdefault((protocol(m), student(m)), {})
            by_teacher[teacher(m)] = by_teacher.get(teacher(m), 0) + 1  # type: ignore[index]
    taught_by = {(p, t): s for (p, s), teachers in starts.items() for t in teachers}
    tracks: dict[Track, list[M]] = {}
    for m in methods:
        proto = protocol(m)
        if teacher(m):
            start = (student(m), teacher(m))
        elif is_teacher_reference(m) and (proto, student(m)) in taught_by:
            start = (taught_by[(proto, student(m))], student(m))
        else:
            teachers = starts.get((proto, student(m)), {})
            chosen = max(sorted(teachers), key=lambda t: teachers[t]) if teachers else None
            start = (student(m), chosen)
        tracks.setdefault(Track(family, start[0], start[1], proto), []).append(m)
    return tracks
