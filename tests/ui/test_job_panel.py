"""How often a job's panel is refreshed: fast while the job starts and in its first seconds (a short
job's result shows soon after its end), then once a second (#19 item 2)."""

from ui.background import Snapshot
from ui.jobs import FAST_FOR_S, FAST_REFRESH_S, REFRESH_S, refresh_every


def snap(state: str, elapsed: float) -> Snapshot:
    return Snapshot("k", "Model summary", state, 0.0, "", elapsed, False, None)


def test_a_starting_or_young_job_is_polled_fast_and_an_old_or_waiting_one_once_a_second():
    assert FAST_REFRESH_S < REFRESH_S
    assert refresh_every(snap("queued", 0.0), ahead=[]) == FAST_REFRESH_S  # its session's thread takes it now
    assert refresh_every(snap("queued", 0.0), ahead=["an earlier job"]) == REFRESH_S  # it waits its turn
    assert refresh_every(snap("running", FAST_FOR_S / 2), ahead=[]) == FAST_REFRESH_S
    assert refresh_every(snap("running", FAST_FOR_S + 0.1), ahead=[]) == REFRESH_S
