"""A background progress thread: completions that nobody waits for still happen.

MPI-style ``wait()`` drives the engine in the caller's thread, which is the fastest path and the one
pycoll uses whenever somebody waits. Frameworks such as PyTorch instead hand out futures and carry
on computing (DDP's reducer waits on the future in C++, without the GIL): someone else must drive
the engine and fire the completion callbacks. :class:`ProgressThread` does, and only while there is
something to drive:

* :meth:`ProgressThread.watch` registers requests with a callback, run exactly once when every one of
  them has finished, in whichever thread saw it first;
* the thread sleeps on a condition while nothing is watched, and also while a caller is inside
  :meth:`ProgressThread.wait` (that caller drives the engine itself; two threads spinning on one
  GIL would only slow each other down);
* when the engine is idle it backs off (spin, yield, short sleeps), so a rank whose transfers wait
  on a peer leaves the core to the computation and to other ranks.

Every engine call is made under ``ctx.lock``: callers that post from other threads hold the same
lock while they post.
"""

from __future__ import annotations

import atexit
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence

from pycoll.engine.context import Backoff, Context
from pycoll.engine.request import Request

#: A watch's callback: called with the first error of its requests, or None.
Callback = Callable[[Optional[BaseException]], None]

#: Back-off of the progress thread when nothing moves: (spin_s, yield_s, sleep_min_s, sleep_max_s).
#: The longest sleep bounds the extra latency of a completion nobody waits for.
THREAD_BACKOFF = (20e-6, 200e-6, 20e-6, 200e-6)


class Watch:
    """Requests watched together; ``callback(error)`` runs once when all of them finished
    (``error`` is the first failure, or None). Made by :meth:`ProgressThread.watch`."""

    __slots__ = ("requests", "callback", "claimed", "called", "error", "background", "_claim_lock")

    def __init__(self, requests: Sequence[Request], callback: Callback, claim_lock: threading.Lock) -> None:
        self.requests = list(requests)
        self.callback = callback
        self.claimed = False  # a thread is running (or ran) the callback
        self.called = False  # the callback returned
        self.error: Optional[BaseException] = None
        self.background = False  # driven by the progress thread
        self._claim_lock = claim_lock

    def _claim(self) -> bool:
        with self._claim_lock:
            if self.claimed:
                return False
            self.claimed = True
            return True

    def finished(self) -> bool:
        """Whether every request's task finished (no engine call)."""
        for req in self.requests:
            if not req.done:
                return False
        return True

    def fire(self, ctx: Context) -> bool:
        """Collect the outcomes and run the callback, once; False if another thread has it."""
        if not self._claim():
            return False
        error = None
        with ctx.lock:  # a request's outcome may recycle its collective into the team's pool
            for req in self.requests:
                try:
                    req.wait()
                except BaseException as exc:  # noqa: BLE001 - handed to the callback
                    if error is None:
                        error = exc
        self._call(error)
        return True

    def fail(self, error: BaseException) -> bool:
        """Run the callback with ``error`` unless a thread has it already (the progress thread
        failed and drives this watch no more); returns whether it ran here."""
        if not self._claim():
            return False
        self._call(error)
        return True

    def _call(self, error: Optional[BaseException]) -> None:
        self.error = error
        try:
            self.callback(error)
        finally:
            self.called = True


class ProgressThread:
    """Drives ``ctx`` from a daemon thread while background watches are unfinished."""

    def __init__(self, ctx: Context, name: str = "pycoll-progress") -> None:
        self.ctx = ctx
        self.name = name
        self._watches: List[Watch] = []
        self._cond = threading.Condition(threading.Lock())
        self._claim_lock = threading.Lock()
        self._waiters = 0
        self._stop = False
        self._thread: Optional[threading.Thread] = None
        self.error: Optional[BaseException] = None  # an unexpected failure of the thread itself

    def watch(self, requests: Sequence[Request], callback: Callback, background: bool = True) -> Watch:
        """Run ``callback(error)`` once every request finished; returns the :class:`Watch`.

        ``background=False`` is for a caller about to :meth:`wait` (a synchronous call): the
        thread is not woken at all, which spares the caller a GIL hand-over per call; a later
        :meth:`drive` hands such a watch to the thread after all."""
        w = Watch(requests, callback, self._claim_lock)
        if background:
            self.drive(w)
        return w

    def drive(self, w: Watch) -> None:
        """Let the thread drive ``w`` to its end (no-op if it already does)."""
        if w.background or w.claimed:
            return
        w.background = True
        if w.finished():
            w.fire(self.ctx)
            return
        with self._cond:
            self._watches.append(w)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            if not self._waiters:
                self._cond.notify()

    def wait(self, w: Watch, timeout: Optional[float] = None) -> None:
        """Drive the engine in this thread until ``w``'s callback has run: raises
        :class:`pycoll.TimeoutError` after ``timeout`` seconds (the work goes on)."""
        if w.called:
            return
        with self._cond:
            self._waiters += 1
        try:
            deadline = None if timeout is None else time.monotonic() + timeout
            for req in w.requests:
                if not req.done:
                    left = None if deadline is None else max(0.0, deadline - time.monotonic())
                    self.ctx.wait_for(req.task, left)
            if not w.fire(self.ctx):
                while not w.called:  # the progress thread is running this watch's callback
                    time.sleep(20e-6)
        finally:
            with self._cond:
                self._waiters -= 1
                if self._watches and not self._waiters:
                    self._cond.notify()  # background work left: the thread takes over again

    def close(self) -> None:
        """Stop the thread (watched requests left unfinished are no longer driven)."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5)

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        ctx = self.ctx
        cond = self._cond
        backoff = Backoff(*THREAD_BACKOFF)
        try:
            while True:
                with cond:
                    while not self._stop and (not self._watches or self._waiters):
                        cond.wait()
                        backoff.reset()
                    if self._stop:
                        return
                    watches = list(self._watches)
                moved = ctx.progress()
                done = [w for w in watches if w.claimed or w.finished()]
                if done:
                    with cond:
                        self._watches = [w for w in self._watches if w not in done]
                    for w in done:
                        w.fire(ctx)
                    moved += 1
                if moved:
                    backoff.reset()
                else:
                    ctx.look()
                    backoff.idle()
        except BaseException as exc:  # noqa: BLE001 - kept for whoever waits next
            self.error = exc
            with cond:
                watches, self._watches = self._watches, []
            for w in watches:
                w.fail(exc)


_threads: Dict[int, ProgressThread] = {}
_threads_lock = threading.Lock()


@atexit.register
def _stop_progress_threads() -> None:
    """Join the progress threads before the interpreter finalizes: a daemon thread still inside
    a callback (torch's ``Future.set_result``) then would abort the process."""
    with _threads_lock:
        threads = list(_threads.values())
        _threads.clear()
    for pt in threads:
        pt.close()


def progress_thread(ctx: Context) -> ProgressThread:
    """The progress thread of ``ctx`` (one per context, shared by every process group and
    scheduler of the process; started on its first watch)."""
    with _threads_lock:
        pt = _threads.get(id(ctx))
        if pt is None:
            pt = _threads[id(ctx)] = ProgressThread(ctx)
        return pt
