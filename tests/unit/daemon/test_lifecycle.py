"""The group state machine allows only its documented transitions; backoff grows, caps and gives up."""

from __future__ import annotations

import dataclasses

import pytest

from stagevisor.supervisor.daemon.lifecycle import (
    TRANSITIONS,
    BackoffPolicy,
    GroupLifecycle,
    GroupState,
    IllegalTransition,
    RestartDecision,
)
from tests.fakes import FakeClock

S = GroupState

# The specification, written out here on purpose rather than read from lifecycle.py:
# a transition added to the table (and its docstring) without changing this list fails.
ALLOWED = {
    (S.STOPPED, S.STARTING),
    (S.STARTING, S.READY),
    (S.STARTING, S.BACKOFF),
    (S.STARTING, S.FAILED),
    (S.STARTING, S.STOPPING),
    (S.READY, S.BACKOFF),
    (S.READY, S.FAILED),
    (S.READY, S.STOPPING),
    (S.BACKOFF, S.STARTING),
    (S.BACKOFF, S.STOPPING),
    (S.STOPPING, S.STOPPED),
    (S.FAILED, S.STARTING),
    (S.FAILED, S.STOPPING),
}
NEVER = sorted(((old, new) for old in S for new in S if (old, new) not in ALLOWED), key=str)


def test_every_transition_in_the_table_is_listed_in_the_enum_docstring():
    doc = GroupState.__doc__
    for old, new in TRANSITIONS:
        assert f"{old.value:<8} -> {new.value}" in doc


def test_a_group_goes_through_start_ready_stop():
    events = []
    lifecycle = GroupLifecycle("vocoder", listener=events.append, clock=FakeClock())
    lifecycle.transition(S.STARTING)
    lifecycle.transition(S.READY, pid=42)
    lifecycle.transition(S.STOPPING)
    lifecycle.transition(S.STOPPED)
    assert [(e.old_state, e.new_state) for e in events] == [
        (S.STOPPED, S.STARTING),
        (S.STARTING, S.READY),
        (S.READY, S.STOPPING),
        (S.STOPPING, S.STOPPED),
    ]
    assert events[1].pid == 42 and lifecycle.pid == 0


def test_the_transition_table_is_exactly_the_specified_one():
    assert TRANSITIONS == ALLOWED


@pytest.mark.parametrize("old,new", NEVER, ids=[f"{o.value}->{n.value}" for o, n in NEVER])
def test_every_transition_the_daemon_must_never_take_is_refused(old, new):
    """Self-loops included: READY -> READY would hide a second handshake, STOPPED -> STOPPED a lost stop."""
    lifecycle = GroupLifecycle("g", state=old)
    with pytest.raises(IllegalTransition, match=f"{old.value} -> {new.value}"):
        lifecycle.transition(new)
    assert lifecycle.state is old


def test_transition_asserts_the_state_it_leaves():
    lifecycle = GroupLifecycle("g", state=S.FAILED)
    with pytest.raises(IllegalTransition):
        lifecycle.transition(S.STARTING, leaving=(S.STOPPED, S.BACKOFF))


def test_ready_records_the_start_time_and_leaving_it_clears_it():
    clock = FakeClock()
    lifecycle = GroupLifecycle("g", clock=clock)
    lifecycle.transition(S.STARTING)
    clock.now = 1234.5
    lifecycle.transition(S.READY, pid=7)
    assert lifecycle.started_at == 1234.5
    lifecycle.transition(S.BACKOFF)
    assert lifecycle.started_at is None and lifecycle.pid == 0


def test_backoff_doubles_and_is_capped():
    policy = BackoffPolicy(max_restarts=10, initial=0.5, factor=2.0, max_delay=3.0)
    delays = [policy.after_exit(ready_for=1.0).delay for _ in range(5)]
    assert delays == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_backoff_gives_up_after_max_consecutive_restarts():
    policy = BackoffPolicy(max_restarts=2)
    decisions = [policy.after_exit(ready_for=0.0).restart for _ in range(3)]
    assert decisions == [True, True, False]


def test_a_worker_that_stayed_ready_long_enough_resets_the_count():
    policy = BackoffPolicy(max_restarts=1, stable_after=30.0)
    assert policy.after_exit(ready_for=1.0).restart
    decision = policy.after_exit(ready_for=45.0)
    assert decision.restart and decision.attempt == 1


def test_a_worker_that_never_became_ready_does_not_reset_the_count():
    policy = BackoffPolicy(max_restarts=1, stable_after=30.0)
    policy.after_exit(ready_for=100.0)
    assert not policy.after_exit(ready_for=None).restart


def test_zero_max_restarts_fails_on_the_first_crash():
    assert not BackoffPolicy(max_restarts=0).after_exit(ready_for=None).restart


def test_negative_max_restarts_is_rejected():
    with pytest.raises(ValueError, match="max_restarts"):
        BackoffPolicy(max_restarts=-1)


@pytest.mark.parametrize("old,new", sorted(ALLOWED, key=str))
def test_every_specified_transition_is_taken(old, new):
    lifecycle = GroupLifecycle("g", state=old)
    event = lifecycle.transition(new)
    assert lifecycle.state is new and (event.old_state, event.new_state) == (old, new)


def test_a_new_group_is_stopped_with_no_worker_and_no_restarts():
    lifecycle = GroupLifecycle("g")
    assert (lifecycle.state, lifecycle.pid, lifecycle.restarts, lifecycle.started_at) == (S.STOPPED, 0, 0, None)


def test_a_transition_with_a_pid_records_it_and_one_without_keeps_it():
    events = []
    lifecycle = GroupLifecycle("g", listener=events.append, clock=FakeClock())
    lifecycle.transition(S.STARTING, pid=41)
    assert lifecycle.pid == 41 and events[-1].pid == 41
    lifecycle.transition(S.READY, pid=42)
    assert lifecycle.pid == 42
    lifecycle.transition(S.STOPPING)
    assert lifecycle.pid == 42 and events[-1].pid == 42  # the event names the worker being stopped


def test_events_and_decisions_are_immutable():
    event = GroupLifecycle("g").transition(S.STARTING)
    decision = BackoffPolicy().after_exit(ready_for=None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.pid = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        decision.delay = 0.0  # type: ignore[misc]


def test_the_default_policy_never_gives_up_on_a_crash_looping_group():
    """Like Kubernetes' CrashLoopBackOff: retried for as long as it crashes, every max_delay seconds."""
    policy = BackoffPolicy()
    decisions = [policy.after_exit(ready_for=1.0) for _ in range(1000)]
    assert all(d.restart for d in decisions)
    assert max(d.delay for d in decisions) == policy.max_delay == 10.0
    assert decisions[-1].attempt == 1000 and policy.consecutive == 1000


def test_a_limit_set_by_the_operator_gives_up_after_that_many_with_no_delay():
    policy = BackoffPolicy(max_restarts=5)
    decisions = [policy.after_exit(ready_for=None) for _ in range(6)]
    assert [d.restart for d in decisions] == [True] * 5 + [False]
    assert decisions[-1] == RestartDecision(False, 0.0, 6)


def test_the_backoff_reason_says_when_a_group_is_crash_looping():
    unlimited, limited = BackoffPolicy(), BackoffPolicy(max_restarts=5)
    first = unlimited.after_exit(ready_for=None)
    assert unlimited.describe(first) == "restart 1 in 0.50s"
    assert limited.describe(limited.after_exit(ready_for=None)) == "restart 1/5 in 0.50s"
    for _ in range(2):
        third = unlimited.after_exit(ready_for=None)
    assert unlimited.describe(third) == "restart 3 in 2.00s (crash loop: 3 crashes in a row; backoff capped at 10s)"


def test_the_crash_count_is_not_a_constructor_argument():
    with pytest.raises(TypeError):
        BackoffPolicy(_consecutive=3)  # type: ignore[call-arg]


@pytest.mark.parametrize("kwargs", [{"initial": -0.5}, {"factor": 0.5}, {"max_delay": -1.0}])
def test_a_negative_delay_or_a_shrinking_factor_is_rejected(kwargs):
    with pytest.raises(ValueError, match="backoff needs"):
        BackoffPolicy(**kwargs)


def test_a_constant_backoff_with_no_initial_delay_is_allowed():
    policy = BackoffPolicy(max_restarts=3, initial=0.0, factor=1.0, max_delay=0.0)
    assert [policy.after_exit(ready_for=None).delay for _ in range(3)] == [0.0, 0.0, 0.0]
    policy = BackoffPolicy(max_restarts=3, initial=1.0, factor=1.5)
    assert [policy.after_exit(ready_for=None).delay for _ in range(3)] == [1.0, 1.5, 2.25]


def test_the_default_policy_caps_the_delay_at_10_s_and_resets_after_30_s_ready():
    policy = BackoffPolicy(max_restarts=10)
    assert [policy.after_exit(ready_for=1.0).delay for _ in range(8)] == [0.5, 1, 2, 4, 8, 10, 10, 10]
    assert policy.after_exit(ready_for=29.9).attempt == 9
    assert policy.after_exit(ready_for=30.0).attempt == 1


def test_two_crashes_in_a_row_are_not_yet_a_crash_loop():
    policy = BackoffPolicy()
    policy.after_exit(ready_for=None)
    second = policy.after_exit(ready_for=None)
    assert policy.describe(second) == "restart 2 in 1.00s"
