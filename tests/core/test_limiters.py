import math
import threading

import numpy as np
import pytest

import helpers
from embodied.core import limiters
from embodied.core.limiters import SamplesPerInsert


# Settings that must be rejected, with a word the message has to contain.
INVALID = [
    ('minsize_zero', dict(samples_per_insert=1, tolerance=1, minsize=0),
     'minsize'),
    ('minsize_negative', dict(samples_per_insert=1, tolerance=1, minsize=-5),
     'minsize'),
    ('minsize_fractional', dict(samples_per_insert=1, tolerance=1, minsize=2.5),
     'minsize'),
    ('tolerance_zero_empty_window',
     dict(samples_per_insert=2, tolerance=0, minsize=1), 'deadlock'),
    ('tolerance_negative', dict(samples_per_insert=2, tolerance=-1, minsize=1),
     'tolerance'),
    ('tolerance_nan', dict(samples_per_insert=2, tolerance=math.nan, minsize=1),
     'tolerance'),
    ('tolerance_inf', dict(samples_per_insert=2, tolerance=math.inf, minsize=1),
     'tolerance'),
    ('ratio_nan', dict(samples_per_insert=math.nan, tolerance=1, minsize=1),
     'samples_per_insert'),
    ('ratio_inf', dict(samples_per_insert=math.inf, tolerance=1, minsize=1),
     'samples_per_insert'),
]

VALID = [
    ('dreamer_defaults', dict(
        samples_per_insert=0.5, tolerance=64, minsize=1040)),
    ('tolerance_below_one', dict(
        samples_per_insert=0.5, tolerance=0.25, minsize=3)),
    ('many_samples_per_insert', dict(
        samples_per_insert=100, tolerance=0.01, minsize=1)),
    ('few_samples_per_insert', dict(
        samples_per_insert=0.01, tolerance=1, minsize=2)),
    ('limit_off_any_tolerance', dict(
        samples_per_insert=0, tolerance=0, minsize=1)),
    ('negative_is_limit_off', dict(
        samples_per_insert=-1 / 16, tolerance=32, minsize=1)),
    ('numpy_numbers', dict(
        samples_per_insert=np.float32(2), tolerance=np.int64(4),
        minsize=np.int64(8))),
]


@pytest.mark.parametrize(
    'kwargs,word', [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_rejects_settings_that_would_deadlock(kwargs, word):
    with pytest.raises(ValueError, match=word):
        SamplesPerInsert(**kwargs)


@pytest.mark.parametrize(
    'kwargs', [c[1] for c in VALID], ids=[c[0] for c in VALID])
def test_valid_settings_never_block_both_sides(kwargs):
    # From every reachable state at least one side may proceed.
    limiter = SamplesPerInsert(**kwargs)
    rng = np.random.default_rng(0)
    for _ in range(3000):
        can_insert, can_sample = limiter.want_insert(), limiter.want_sample()
        assert can_insert or can_sample, limiter.state()
        if can_insert and (not can_sample or rng.random() < 0.5):
            limiter.insert()
        else:
            limiter.sample()


def test_want_insert_tells_whether_that_many_inserts_would_pass():
    for spi, tolerance in ((2.0, 3.0), (0.5, 8.0), (32 / 12, 32.0)):
        limiter = SamplesPerInsert(spi, tolerance=tolerance, minsize=3)
        rng = np.random.default_rng(0)
        for _ in range(400):
            for count in (1, 2, 5, 16):
                probe = SamplesPerInsert(spi, tolerance=tolerance, minsize=3)
                probe.load(limiter.save())
                passed = 0
                while passed < count and probe.try_insert():
                    passed += 1
                if limiter.size >= limiter.minsize:
                    assert limiter.want_insert(count) == (passed == count), (
                        count, limiter.state())
            if limiter.want_insert() and (
                    not limiter.want_sample() or rng.random() < 0.5):
                limiter.insert()
            else:
                limiter.sample()
    assert SamplesPerInsert(1, tolerance=1, minsize=5).want_insert(100)


@pytest.mark.parametrize(
    'kwargs', [c[1] for c in VALID], ids=[c[0] for c in VALID])
def test_inserts_waiting_for_room_for_half_the_tolerance_never_deadlock(
        kwargs):
    limiter = SamplesPerInsert(**kwargs)
    count = max(1, int(limiter.tolerance // 2))
    rng = np.random.default_rng(0)
    for _ in range(3000):
        can_insert = limiter.want_insert(count)
        can_sample = limiter.want_sample()
        assert can_insert or can_sample, limiter.state()
        if can_insert and (not can_sample or rng.random() < 0.5):
            assert limiter.try_insert(count), limiter.state()
        else:
            limiter.sample()


def test_inserts_are_free_until_minsize_then_credit():
    limiter = SamplesPerInsert(samples_per_insert=2, tolerance=3, minsize=4)
    for _ in range(3):
        assert limiter.want_insert()
        assert not limiter.want_sample()
        limiter.insert()
        assert limiter.avail == 0
    limiter.insert()  # Reaches minsize: the first credited insert.
    assert limiter.avail == 2
    # The inserter may run `tolerance` inserts ahead: avail < 3 * 2.
    limiter.insert()
    limiter.insert()
    assert limiter.avail == 6 and not limiter.want_insert()
    # The sampler may overdraw by `tolerance` samples: avail > -3.
    sampled = 0
    while limiter.want_sample():
        limiter.sample()
        sampled += 1
    assert sampled == 9 and limiter.avail == -3
    assert limiter.want_insert()


@pytest.mark.parametrize('samples_per_insert', [0, -1 / 16])
def test_disabled_limit_only_holds_minsize(samples_per_insert):
    # A negative ratio is the original's `train_ratio: -1`: no limit.
    limiter = SamplesPerInsert(samples_per_insert, tolerance=1, minsize=2)
    limiter.insert()
    assert not limiter.want_sample()
    limiter.insert()
    for _ in range(100):
        assert limiter.want_sample()
        limiter.sample()
    for _ in range(100):
        assert limiter.want_insert() and limiter.want_insert(count=8)
        limiter.insert()


def test_try_methods_check_and_record_atomically():
    limiter = SamplesPerInsert(samples_per_insert=1, tolerance=1, minsize=1)
    assert not limiter.try_sample()
    assert limiter.try_insert()            # avail 1
    assert not limiter.try_insert()        # 1 >= max_avail 1
    assert limiter.try_sample()            # avail 0
    assert limiter.try_sample()            # avail -1
    assert not limiter.try_sample()        # -1 <= min_avail -1
    assert limiter.state()['avail'] == -1


def test_try_insert_records_as_many_as_single_tries_would():
    for count in (1, 3, 10):
        one = SamplesPerInsert(samples_per_insert=2, tolerance=2, minsize=2)
        many = SamplesPerInsert(samples_per_insert=2, tolerance=2, minsize=2)
        for _ in range(3):
            singles = 0
            while singles < count and one.try_insert():
                singles += 1
            assert many.try_insert(count) == singles
            assert many.state() == one.state()
            one.sample()
            many.sample()
    limiter = SamplesPerInsert(samples_per_insert=2, tolerance=2, minsize=2)
    limiter.insert(5)  # Unconditional, as 5 calls of insert().
    assert limiter.size == 5 and limiter.avail == 8


def test_try_sample_records_as_many_as_single_tries_would():
    for count in (1, 3, 10):
        one = SamplesPerInsert(samples_per_insert=2, tolerance=2, minsize=1)
        many = SamplesPerInsert(samples_per_insert=2, tolerance=2, minsize=1)
        assert many.try_sample(count) == 0  # Under minsize.
        for _ in range(3):
            one.insert()
            many.insert()
            singles = 0
            while singles < count and one.try_sample():
                singles += 1
            assert many.try_sample(count) == singles
            assert many.state() == one.state()


def test_save_load_restores_balance_and_applies_new_ratio_to_future():
    limiter = SamplesPerInsert(samples_per_insert=2, tolerance=10, minsize=1)
    for _ in range(5):
        limiter.insert()
    limiter.sample()
    data = limiter.save()
    assert data == {'size': 5, 'avail': 9.0}
    restored = SamplesPerInsert(samples_per_insert=0.5, tolerance=10, minsize=1)
    restored.load(data)
    assert restored.size == 5 and restored.avail == 9.0
    restored.insert()
    assert restored.avail == 9.5
    with pytest.raises(KeyError, match='avail'):
        restored.load({'size': 3})


def test_state_and_describe_name_the_numbers():
    limiter = SamplesPerInsert(samples_per_insert=0.5, tolerance=4, minsize=2)
    limiter.insert()
    state = limiter.state()
    assert state['size'] == 1 and state['minsize'] == 2
    assert state['avail'] == 0 and state['samples_per_insert'] == 0.5
    assert state['min_avail'] == -4 and state['max_avail'] == 2
    assert 'size=1/2' in limiter.describe()


def test_ratio_holds_under_concurrent_inserters_and_samplers():
    spi, tolerance, minsize, total = 0.5, 8, 50, 2000
    limiter = SamplesPerInsert(spi, tolerance, minsize)
    stop = threading.Event()
    lock = threading.Lock()
    counts = {'inserts': 0, 'samples': 0}
    seen = []  # avail right after each step, read under the limiter's lock
    errors = []
    failed = threading.Event()

    def inserter():
        try:
            while True:
                with lock:
                    if counts['inserts'] >= total:
                        return
                    counts['inserts'] += 1  # Reserve one insert.
                limiters.wait(limiter.try_insert, 'insert', release=stop)
                seen.append(limiter.avail)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)
            failed.set()

    def sampler():
        try:
            while True:
                limiters.wait(limiter.try_sample, 'sample', release=stop)
                with lock:
                    counts['samples'] += 1
                seen.append(limiter.avail)
        except limiters.Released:
            pass
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)
            failed.set()

    threads = [threading.Thread(target=inserter) for _ in range(2)]
    threads += [threading.Thread(target=sampler) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads[:2]:
        thread.join(timeout=60)
    # Once the inserters are done, the samplers spend the remaining credit.
    try:
        limiters.wait(lambda: not limiter.want_sample(), 'drain',
                      report_every=5, release=failed)
    finally:
        stop.set()
    for thread in threads[2:]:
        thread.join(timeout=10)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors

    credited = counts['inserts'] - minsize + 1
    balance = spi * credited - counts['samples']
    # Each side checks before its step, so it overshoots by at most one step.
    assert -tolerance - 1 < balance <= -tolerance
    assert min(seen) > -tolerance - 1
    assert max(seen) < tolerance * spi + spi
    ratio = counts['samples'] / credited
    assert abs(ratio - spi) <= (tolerance + 1) / credited


def test_wait_returns_at_once_when_predicate_holds():
    assert limiters.wait(lambda: True, 'never shown') == 0.0


def test_wait_returns_seconds_waited():
    calls = []

    def predicate():
        calls.append(None)
        return len(calls) >= 5
    waited = limiters.wait(predicate, 'waiting')
    assert waited > 0 and len(calls) == 5


def test_wait_reports_message_time_and_info(capsys):
    reports = []

    def info():
        reports.append(None)
        return {'size': 3, 'avail': -1.5}
    limiters.wait(lambda: len(reports) >= 2, 'Replay sample is waiting',
                  info, report_every=0.02)
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith('Replay sample is waiting (waited ')
    assert 'size=3' in lines[0] and 'avail=-1.5' in lines[0]


def test_wait_without_reports_prints_nothing(capsys):
    calls = []
    limiters.wait(lambda: calls.append(None) or len(calls) > 3, 'quiet',
                  report_every=None)
    assert capsys.readouterr().out == ''


def test_release_unblocks_a_wait():
    release = threading.Event()
    error = helpers.released_error(
        lambda: limiters.wait(
            lambda: False, 'blocked forever', release=release),
        release.set)
    assert 'blocked forever' in str(error)


def test_wait_on_condition_wakes_on_notify_and_release():
    changed = threading.Condition()
    release = threading.Event()
    state = {'ready': False}
    outcome = []

    def waiter(predicate):
        try:
            outcome.append(limiters.wait(
                predicate, 'waiting', release=release, changed=changed))
        except limiters.Released as e:
            outcome.append(e)

    # Let the waiter back off to its longest poll, then notify.
    thread = threading.Thread(target=waiter, args=(lambda: state['ready'],))
    thread.start()
    threading.Event().wait(0.3)
    with changed:
        state['ready'] = True
        changed.notify_all()
    thread.join(timeout=10)
    assert not thread.is_alive() and isinstance(outcome[0], float)

    thread = threading.Thread(target=waiter, args=(lambda: False,))
    thread.start()
    release.set()
    with changed:
        changed.notify_all()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert isinstance(outcome[1], limiters.Released)
