"""Work on several threads at once, for the concurrency tests."""
import threading


def run_threads(work, n, timeout=300):
    """Runs work(i) for i in range(n), each on its own thread, all started together; returns the
    exceptions they raised (a thread's failure is reported by the caller's thread)."""
    errors = []

    def guarded(i):
        try:
            work(i)
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    return errors
