"""Work on several threads at once, for the concurrency tests."""
import threading
import time


def run_threads(work, n, timeout=300):
    """Runs work(i) for i in range(n), each on its own thread, released together by a barrier;
    returns the exceptions they raised (a thread's failure is reported by the caller's thread),
    a TimeoutError for each thread still running after `timeout` seconds in all."""
    errors = []
    start = threading.Barrier(n)

    def guarded(i):
        try:
            start.wait()
            work(i)
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=guarded, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    errors += [TimeoutError(f"thread {i} still running after {timeout} s") for i, t in enumerate(threads)
               if t.is_alive()]
    return errors
