"""The collector pause around a rewrite: off inside, back as it was after,
also when pauses nest, overlap across threads or end with an exception."""

import gc
import threading

import pytest

from tf_fusionstitch.runtime import gc_pause


@pytest.fixture(autouse=True)
def collector_enabled():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_off_inside_on_after():
    with gc_pause.paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_nested_pauses_resume_once_at_the_outermost():
    with gc_pause.paused():
        with gc_pause.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_the_caller_disabled_stays_disabled():
    gc.disable()
    with gc_pause.paused():
        pass
    assert not gc.isenabled()


def test_an_exception_inside_still_resumes():
    with pytest.raises(ValueError):
        with gc_pause.paused():
            raise ValueError("the rewrite failed")
    assert gc.isenabled()


def test_overlapping_pauses_on_two_threads_resume_when_the_last_ends():
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first():
        with gc_pause.paused():
            first_in.set()
            second_in.wait(5)
        first_out.set()

    def second():
        first_in.wait(5)
        with gc_pause.paused():
            second_in.set()
            first_out.wait(5)
            seen["after the first ended"] = gc.isenabled()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == {"after the first ended": False}
    assert gc.isenabled()
