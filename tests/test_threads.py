"""h3kernels.testing.threads.run_threads, which the concurrency tests stand on (CPU)."""
import threading

from h3kernels.testing.threads import run_threads


def test_threads_start_together_and_their_errors_come_back():
    seen, lock = [], threading.Lock()

    def work(i):
        with lock:
            seen.append(i)
        if i == 2:
            raise ValueError("two")

    errors = run_threads(work, 4, timeout=30)
    assert sorted(seen) == [0, 1, 2, 3]
    assert [str(e) for e in errors] == ["two"]


def test_a_thread_that_does_not_finish_is_an_error():
    release = threading.Event()
    errors = run_threads(lambda i: release.wait(30) if i == 1 else None, 3, timeout=0.5)
    release.set()
    assert len(errors) == 1 and isinstance(errors[0], TimeoutError) and "thread 1" in str(errors[0])
