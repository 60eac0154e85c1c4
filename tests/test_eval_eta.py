"""The eval bar's ETA with a fake clock: episodes run side by side, so time left is not episodes left times
the time the first one took (that read "1:12:44" for a run that ended in 100 s)."""

from __future__ import annotations

from evaluation.policy_eval import EpisodeEta, _Progress


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_all_episodes_side_by_side_the_first_to_end_does_not_stretch_the_estimate():
    # the reported run: 100 episodes at once, the first ends at 44 s, the last at 100 s
    clock = FakeClock()
    eta = EpisodeEta(total=100, slots=100, clock=clock)
    ends = [44 + 56 * i / 99 for i in range(100)]
    for index, end in enumerate(ends):
        clock.now = end
        eta.finished(index)
        left, truth = eta.seconds_left(), 100 - end
        if index < 90:  # through the run, within a factor of two of the truth (per-episode: 99 x 44 s at first)
            assert truth / 2 <= left <= truth * 2, (index, left, truth)
    assert eta.seconds_left() == 0.0


def test_waves_of_equal_episodes_are_estimated_exactly():
    # 10 slots, 100 episodes of 10 s each: ten waves, the run ends at 100 s
    clock = FakeClock()
    eta = EpisodeEta(total=100, slots=10, clock=clock)
    assert eta.seconds_left() is None  # nothing has ended: no estimate
    for wave in range(10):
        clock.now = 10.0 * (wave + 1)
        for k in range(10):
            eta.finished(wave * 10 + k)
        assert eta.seconds_left() == 100.0 - clock.now


def test_continuous_batching_with_mixed_lengths_stays_close():
    # 4 slots, episodes alternating 5 s and 15 s: each slot takes the next episode the moment one ends
    import heapq

    lengths = [5.0 if k % 2 else 15.0 for k in range(40)]
    running = [(lengths[k], k) for k in range(4)]
    heapq.heapify(running)
    order, next_k = [], 4
    while running:
        end, k = heapq.heappop(running)
        order.append((end, k))
        if next_k < len(lengths):
            heapq.heappush(running, (end + lengths[next_k], next_k))
            next_k += 1
    finish = order[-1][0]
    clock = FakeClock()
    eta = EpisodeEta(total=40, slots=4, clock=clock)
    for end, k in order:
        clock.now = end
        eta.finished(k)
        if 0.2 * finish <= end <= 0.8 * finish:
            assert 0.5 * (finish - end) <= eta.seconds_left() <= 1.5 * (finish - end), (end, eta.seconds_left())


def test_the_bar_shows_the_estimate_after_the_first_episode():
    from agentgym_opd.types import Episode, Task

    clock = FakeClock()
    bar = _Progress(20, "eval", False, None, 0, None, slots=20, clock=clock)
    assert bar.eta_text() == "?"
    clock.now = 30.0
    bar(0, Episode(task=Task("t0", "household/train", "train", "do it", {}, {}), initial_observation="start"))
    # the other 19 have run as long as the mean: 30 s x the share still running (19/20) = 28.5 s
    assert bar.eta_text() == "00:28"
